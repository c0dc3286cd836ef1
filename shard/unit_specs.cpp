#include "shard/unit_specs.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include <zshard/error.h>

#include "comm/agreed_failure.h"
#include "kernels/io/checksum.h"

namespace zshard {

void check_unit_specs(const std::vector<UnitSpec>& specs) {
  std::map<std::string, size_t> units;
  std::map<std::string, std::string> params;  // name -> its unit
  for (size_t i = 0; i < specs.size(); ++i) {
    const UnitSpec& unit = specs[i];
    if (auto [it, fresh] = units.emplace(unit.name, i); !fresh)
      fail("model units ", it->second, " and ", i, " are both named '", unit.name, "'; a unit's name must be unique");
    for (const ParamSpec& p : unit.params) {
      if (p.name.empty() || p.name == "__metadata__")
        fail("unit '", unit.name, "': a parameter named '", p.name, "', which no weights file can hold");
      int64_t numel = 1;
      for (int64_t d : p.shape) {
        if (d < 0)
          fail("unit '", unit.name, "', parameter '", p.name, "': shape ", shape_str(p.shape), " has a negative dimension");
        if (__builtin_mul_overflow(numel, d, &numel))
          fail("unit '", unit.name, "', parameter '", p.name, "': shape ", shape_str(p.shape),
               " has more elements than a 64-bit count holds");
      }
      if (auto [it, fresh] = params.emplace(p.name, unit.name); !fresh)
        fail("parameter '", p.name, "' is given twice (units '", it->second, "' and '", unit.name,
             "'); a parameter's name must be unique in the model");
    }
  }
}

namespace {

// A unit's checksum: its name and every parameter's name, shape and flags, each field delimited.
uint64_t unit_checksum(const UnitSpec& unit) {
  Xxh3Stream h;
  const auto text = [&](const std::string& s) { h.update(s.c_str(), s.size() + 1); };
  const auto number = [&](int64_t v) { h.update(&v, sizeof v); };
  text(unit.name);
  for (const ParamSpec& p : unit.params) {
    text(p.name);
    number(int64_t(p.shape.size()));
    for (int64_t d : p.shape) number(d);
    number(int64_t(p.weight_decay) << 1 | int64_t(p.frozen));
  }
  return h.digest();
}

}  // namespace

void check_same_units_on_every_rank(const std::vector<UnitSpec>& specs, comm::Communicator& world) {
  const size_t ranks = size_t(world.size());
  const int32_t count = int32_t(specs.size());
  std::vector<int32_t> counts(ranks);
  world.all_gather(&count, counts.data(), 1, DType::i32)->wait();
  // The units every rank has, compared as checksums: each a pair of i32 words.
  const size_t common = size_t(*std::min_element(counts.begin(), counts.end()));
  std::vector<uint64_t> mine(common), all(common * ranks);
  for (size_t u = 0; u < common; ++u) mine[u] = unit_checksum(specs[u]);
  if (common > 0) world.all_gather(mine.data(), all.data(), 2 * common, DType::i32)->wait();
  run_agreed(world, [&] {
    for (size_t u = 0; u < common; ++u)
      for (size_t r = 1; r < ranks; ++r)
        if (all[r * common + u] != all[u])
          fail("the model's unit ", u, " ('", specs[u].name, "' on rank ", world.rank(), ") differs between ranks 0 and ",
               r, ": every rank must build the same model (units, parameter names, shapes and flags)");
    for (size_t r = 1; r < ranks; ++r)
      if (counts[r] != counts[0])
        fail("the model has ", counts[0], " unit(s) on rank 0 and ", counts[r], " on rank ", r,
             ": every rank must build the same model");
  });
}

}  // namespace zshard
