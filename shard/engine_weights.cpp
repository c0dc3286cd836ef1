// Engine::import_weights, export_weights and export_adapters: the weights as one safetensors file with the
// model's parameter names (what zshard-train's --init-from reads and --save writes), read whole by every
// rank, each keeping what it holds of each unit, and written by rank 0 a gathered unit at a time.

#include <algorithm>
#include <exception>

#include <zshard/engine.h>
#include <zshard/error.h>

#include "comm/agreed_failure.h"
#include "shard/weights_file.h"
#include "shard/checkpoint_format.h"
#include "shard/engine_state.h"
#include "shard/sharded_params.h"

namespace zshard {

void Engine::import_weights(const std::string& path) {
  // Every rank checks before any rank changes a weight: a file that differs between hosts, or that one
  // rank cannot read, must leave every rank's weights as they were.
  run_agreed(world_, [&] { check_weights_file(path, model_); });
  discard_step();
  bool frozen_changed = false;
  run_agreed(world_, [&] {
    const SafetensorsFile file = SafetensorsFile::open(path);
    const WeightsCoverage coverage = weights_coverage(file, model_.units());
    // A base file leaves the adapters as they are, an adapter file the rest: each flat buffer is set
    // whole from the file, or left whole.
    const auto taken = [&](const FlatLayout& layout) {
      size_t in_file = 0;
      for (const ParamSpec& p : layout.spec().params)
        in_file += coverage == WeightsCoverage::everything || (coverage == WeightsCoverage::adapters) == is_adapter(p.name);
      // A usage error (exit 2): the same file and flags fail the same way on a relaunch.
      if (in_file > 0 && in_file < layout.spec().params.size())
        throw UsageError(detail::concat(path, ": holds some of unit ", layout.spec().name,
                                        "'s parameters and not others that share their buffer (an adapter frozen "
                                        "by --freeze beside a base file, or the other way round): start such a "
                                        "run from the seed"));
      return in_file > 0;
    };
    const auto read = [&](const FlatLayout& layout) {
      FlatValues full(size_t(layout.padded_numel()), 0.0f);
      for (size_t i = 0; i < layout.spec().params.size(); ++i) {
        const ParamSpec& p = layout.spec().params[i];
        file.read_f32(resolve_name(file, p.name), full.data() + layout.offset(int(i)), p.shape);
      }
      return full;
    };
    // Which buffers the file sets, every one decided (and a mixed one refused) before any is changed.
    std::vector<std::pair<bool, bool>> sets;  // per unit: the trainable buffer, the frozen one
    for (int u = 0; u < state_->params_->num_units(); ++u)
      sets.emplace_back(taken(state_->params_->layout(u)), taken(state_->params_->frozen_layout(u)));
    for (int u = 0; u < state_->params_->num_units(); ++u) {
      if (sets[size_t(u)].first) state_->params_->set_unit_params(u, read(state_->params_->layout(u)).data());
      if (sets[size_t(u)].second) state_->params_->set_frozen_params(u, read(state_->params_->frozen_layout(u)).data());
    }
    frozen_changed = coverage != WeightsCoverage::adapters;
  });
  if (frozen_changed) {
    state_->frozen_source_ = path;
    state_->frozen_fingerprint_.clear();
  }
}

// Every rank takes part in each unit's gather, in order; rank 0 writes each unit as it comes and drops it
// before the next: no rank holds more than a unit whole, whatever the model's size. The ranks agree on the
// write alone: a gather that fails ends the job (run_tool) as any collective's failure does.
void Engine::export_weights(const std::string& path) {
  int gathered = 0;
  bool gather_failed = false;
  const auto gather = [&](int unit) {
    try {
      FlatValues whole = state_->params_->whole_unit_params(unit);
      ++gathered;
      return whole;
    } catch (...) {
      gather_failed = true;
      throw;
    }
  };
  std::exception_ptr write_failed;  // a full disk, a non-finite weight: rank 0's alone
  if (world_.rank() == 0) {
    try {
      save_consolidated(path, model_.units(), gather);
    } catch (...) {
      if (gather_failed) throw;
      write_failed = std::current_exception();
    }
  }
  while (gathered < state_->params_->num_units()) gather(gathered);  // the units the file did not take
  run_agreed(world_, [&] {
    if (write_failed) std::rethrow_exception(write_failed);
  });
}

void Engine::export_adapters(const std::string& path) {
  const std::vector<UnitSpec> specs = model_.units();
  const bool any = std::any_of(specs.begin(), specs.end(), [](const UnitSpec& unit) {
    return std::any_of(unit.params.begin(), unit.params.end(), [](const ParamSpec& p) { return is_adapter(p.name); });
  });
  // Every rank sees the same units: all refuse alike, before any collective.
  if (!any) refuse("export_adapters(", path, "): the model has no LoRA adapters (export_weights writes its weights)");
  std::vector<FlatValues> units(specs.size());
  for (int u = 0; u < state_->params_->num_units(); ++u)
    if (std::any_of(specs[u].params.begin(), specs[u].params.end(), [](const ParamSpec& p) { return is_adapter(p.name); })) {
      FlatValues whole = state_->params_->whole_unit_params(u);  // adapters are small: rank 0 keeps them all
      if (world_.rank() == 0) units[size_t(u)] = std::move(whole);
    }
  run_agreed(world_, [&] {
    if (world_.rank() == 0) save_adapters(path, specs, units);
  });
}

}  // namespace zshard
