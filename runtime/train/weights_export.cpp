#include "runtime/train/weights_export.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include <zshard/model_registry.h>
#include <zshard/plan.h>

#include "comm/agreed_failure.h"
#include "comm/self_communicator.h"
#include "kernels/io/atomic_file.h"
#include "models/config_json.h"
#include "models/lora.h"
#include "runtime/cli/json_input.h"
#include "runtime/cli/path_checks.h"
#include "runtime/train/save_policy.h"
#include "shard/checkpoint_format.h"
#include "shard/engine_internals.h"
#include "shard/plan_internals.h"
#include "shard/sharded_params.h"
#include "shard/weights_file.h"

namespace zshard {

namespace {

// The adapters of a model that has any.
const LoraPlan* adapters_of(const Model& model) {
  const auto* lora = dynamic_cast<const LoraModel*>(&model);
  return lora && lora->lora_plan().enabled() ? &lora->lora_plan() : nullptr;
}

std::string write_adapter_config(const std::string& weights_path, const LoraPlan& lora) {
  const std::string path = adapter_config_path(weights_path);
  write_file_atomically(path, lora.peft_config());
  return path;
}

}  // namespace

void check_adapter_config_output(std::string_view flag, const std::string& weights_path, const Model& model) {
  const LoraPlan* lora = adapters_of(model);
  const std::string path = adapter_config_path(weights_path);
  std::error_code ec;
  if (!lora || !std::filesystem::exists(path, ec)) return;
  // Replacing DIR/adapter_model.safetensors replaces the adapters the config describes: it may change.
  if (std::filesystem::path(weights_path).filename() == "adapter_model.safetensors") return;
  const nlohmann::json config = read_json_file(flag, path);  // one that does not parse is named as such
  try {
    lora->check_peft_config(config, path);
  } catch (const UsageError&) {
    refuse(flag, "'s adapter_config.json ", path, " describes other adapters (those of the directory's ",
           "adapter_model.safetensors?): refusing to overwrite it; save into another directory, or as ",
           "adapter_model.safetensors to replace them");
  }
}

namespace {

// The model a checkpoint was trained on, from its manifest.
std::unique_ptr<Model> saved_model_of(const std::string& dir, const Manifest& manifest) {
  std::string name;
  ModelConfig config;
  try {
    const nlohmann::json model = saved_model(manifest.run);
    name = model.at("name").get<std::string>();
    config = model.at("config").get<ModelConfig>();
  } catch (const nlohmann::json::exception& e) {
    fail(dir, "/", kManifestFile, ": names no model (", e.what(), ")");
  }
  const std::vector<std::string> known = model_names();
  if (std::find(known.begin(), known.end(), name) == known.end())
    refuse(dir, ": trained on model '", name, "', which this binary does not have (a model of one's own: ",
           "export with its train_main binary's export mode, `BINARY export ", dir, " OUT`)");
  return build_model(name, config);
}

// The same where this binary knows the model; null where the checkpoint names none (a loop of one's own
// may save no run state) or one registered by another binary.
std::unique_ptr<Model> known_model_of(const std::string& dir, const Manifest& manifest) {
  std::string name;
  try {
    name = saved_model(manifest.run).at("name").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
  const std::vector<std::string> known = model_names();
  if (std::find(known.begin(), known.end(), name) == known.end()) return nullptr;
  try {
    return saved_model_of(dir, manifest);
  } catch (const Error&) {
    return nullptr;  // a configuration this binary's builder refuses: the files alone still export
  }
}

// The seed a checkpoint's frozen parameters came from, when they came from one.
std::optional<uint64_t> frozen_seed(const Manifest& manifest) {
  constexpr std::string_view kSeed = "seed ";
  if (!manifest.frozen.source.starts_with(kSeed)) return std::nullopt;
  return std::stoull(manifest.frozen.source.substr(kSeed.size()));
}

// What the run held its parameters in (fp32 for a checkpoint that does not say). A frozen parameter has no
// fp32 master: it lives in this dtype alone, so the run's --save wrote it rounded to it, and so does an
// export.
DType saved_param_dtype(const Manifest& manifest) {
  const nlohmann::json flags = manifest.run.value("flags", nlohmann::json::object());
  return flags.is_object() && flags.value("param-dtype", "") == dtype_flag(DType::bf16) ? DType::bf16 : DType::f32;
}

// The weights of the model without adapters, a unit at a time: each unit's parameters with its adapters
// folded into their layers and dropped (LoraPlan::merge), written as the file reaches the unit and dropped
// before the next (save_consolidated), beside the engine's own copy of the model.
void save_merged(Engine& engine, const Model& model, const LoraPlan& lora, const std::string& path) {
  ShardedParams& params = EngineInternals::params(engine);
  const std::vector<UnitSpec> units = model.units();
  std::vector<UnitSpec> merged = units;
  for (UnitSpec& unit : merged) std::erase_if(unit.params, [](const ParamSpec& p) { return is_adapter(p.name); });
  save_consolidated(path, merged, [&](int u) {
    const FlatValues whole = params.whole_unit_params(u);
    const FlatLayout layout(units[size_t(u)], 1), merged_layout(merged[size_t(u)], 1);
    std::vector<NamedWeight> weights;
    for (size_t i = 0; i < units[size_t(u)].params.size(); ++i) {
      const ParamSpec& p = units[size_t(u)].params[i];
      const auto begin = whole.begin() + layout.offset(int(i));
      weights.push_back({p.name, p.shape, TrackedFloats(begin, begin + p.numel())});
    }
    lora.merge(weights);
    ZS_CHECK(weights.size() == merged[size_t(u)].params.size(), "merged unit ", merged[size_t(u)].name, ": ",
             weights.size(), " weights for ", merged[size_t(u)].params.size(), " parameters");
    FlatValues values(size_t(merged_layout.numel()));
    for (size_t i = 0; i < weights.size(); ++i) {
      ZS_CHECK(weights[i].name == merged[size_t(u)].params[i].name, "merged unit ", merged[size_t(u)].name, ": ",
               weights[i].name, " where ", merged[size_t(u)].params[i].name, " belongs");
      std::copy(weights[i].values.begin(), weights[i].values.end(), values.begin() + merged_layout.offset(int(i)));
    }
    return values;
  });
}

}  // namespace

WeightsCoverage check_init_from(const std::string& path, const Model& model) {
  check_input_file("--init-from", path, "a safetensors file");
  WeightsCoverage coverage{};
  try {
    coverage = check_weights_file(path, model);
  } catch (const Error& e) {
    refuse("--init-from ", e.what());
  }
  // Adapters alone, with PEFT's adapter_config.json beside them: adapters of another alpha would be scaled
  // by the run's, silently.
  const LoraPlan* lora = adapters_of(model);
  const std::string config = adapter_config_path(path);
  std::error_code ec;
  if (lora && coverage == WeightsCoverage::adapters && std::filesystem::exists(config, ec))
    lora->check_peft_config(read_json_file("--init-from", config), config);
  return coverage;
}

void check_init_base_and_adapters(const std::string& base, const std::string& adapters, const Model& model) {
  if (base.empty()) return;
  const WeightsCoverage base_coverage = check_init_from(base, model);
  if (adapters.empty()) return;
  if (base_coverage == WeightsCoverage::adapters)
    refuse("--init-from ", base, ": the first file of BASE,ADAPTERS holds LoRA adapters alone, not a base's weights");
  const WeightsCoverage coverage = check_init_from(adapters, model);
  if (!adapters_of(model)) refuse("--init-from ", adapters, ": an adapter file (BASE,ADAPTERS) needs --lora-rank");
  if (coverage != WeightsCoverage::adapters)
    refuse("--init-from ", adapters, ": the second file of BASE,ADAPTERS holds base weights, not LoRA adapters alone");
}

std::vector<std::string> save_weights(Engine& engine, const Model& model, comm::Communicator& world,
                                      const std::string& path) {
  const LoraPlan* lora = adapters_of(model);
  if (!lora) {
    engine.export_weights(path);
    return {path};
  }
  engine.export_adapters(path);
  std::vector<std::string> written = {path};
  run_agreed(world, [&] {
    if (world.rank() == 0) written.push_back(write_adapter_config(path, *lora));
  });
  return written;
}

std::vector<std::string> export_weights(const ExportRequest& r) {
  const Manifest manifest = read_manifest(r.checkpoint);
  // Nothing frozen: no adapters either, and no model needed (a model registered by another binary exports).
  if (manifest.frozen.params == 0 && !r.merge_lora) {
    if (!r.init_from.empty())
      refuse("--init-from: ", r.checkpoint, " holds every parameter (nothing was frozen): no base is needed");
    // Where this binary knows the model, the manifest's units are its units: a unit edited out of it would
    // leave the file without that unit's weights, found only when the file is loaded.
    if (const std::unique_ptr<Model> model = known_model_of(r.checkpoint, manifest))
      check_units(r.checkpoint, manifest, model->units());
    export_checkpoint(r.checkpoint, r.output);
    return {r.output};
  }
  const std::unique_ptr<Model> model = saved_model_of(r.checkpoint, manifest);
  const LoraPlan* lora = adapters_of(*model);
  if (r.merge_lora && !lora)
    refuse("--merge-lora: ", r.checkpoint, " holds a model without LoRA adapters: nothing to merge");
  if (!r.merge_lora) check_adapter_config_output("output", r.output, *model);

  // What the checkpoint trained, and what --save would write: the adapters with LoRA, else every parameter.
  std::set<std::string> trained, saved;
  std::vector<std::string> frozen_here;  // frozen by --freeze rather than by the model
  for (const UnitSpec& unit : manifest.units)
    for (const ParamSpec& p : unit.params) trained.insert(p.name);
  for (const UnitSpec& unit : model->units())
    for (const ParamSpec& p : unit.params) {
      if (!lora || is_adapter(p.name)) saved.insert(p.name);
      if (!p.frozen && !trained.count(p.name)) frozen_here.push_back(p.name);
    }
  if (!r.merge_lora && trained == saved) {
    if (!r.init_from.empty())
      refuse("--init-from: ", r.checkpoint, " holds every adapter: no base is needed (--merge-lora folds them into it)");
    save_adapters(r.output, manifest.units, read_checkpoint_params(r.checkpoint, manifest));
    return {r.output, write_adapter_config(r.output, *lora)};
  }

  // The model around the checkpoint's parameters, on the frozen weights it was trained beside.
  const std::optional<uint64_t> seed = frozen_seed(manifest);
  if (r.init_from.empty() && !seed)
    refuse(r.checkpoint, " was trained beside frozen parameters from ", manifest.frozen.source,
           ", which it does not hold: give them as --init-from");
  if (!r.init_from.empty()) check_init_from(r.init_from, *model);
  comm::SelfCommunicator self;
  PlanOptions plan;
  plan.placement.param_dtype = saved_param_dtype(manifest);
  Engine engine(*model, self, resolve_plan(plan, self), {seed.value_or(EngineOptions{}.seed), 1, 1, frozen_here});
  if (!r.init_from.empty()) engine.import_weights(r.init_from);
  engine.load(r.checkpoint);
  if (!r.merge_lora) return save_weights(engine, *model, self, r.output);
  save_merged(engine, *model, *lora, r.output);
  return {r.output};
}

}  // namespace zshard
