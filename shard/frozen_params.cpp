#include "shard/frozen_params.h"

#include <fnmatch.h>

#include <zshard/error.h>

#include "kernels/option_names.h"

namespace zshard {

bool name_matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;  // no FNM_PATHNAME: '*' crosses dots
}

std::vector<UnitSpec> freeze_matching(std::vector<UnitSpec> units, const std::vector<std::string>& patterns) {
  for (const std::string& pattern : patterns) {
    if (pattern.empty()) refuse(option_name(Option::freeze), ": an empty pattern");
    bool matched = false;
    for (UnitSpec& unit : units)
      for (ParamSpec& p : unit.params)
        if (name_matches(pattern, p.name)) p.frozen = matched = true;
    if (!matched) refuse(option_name(Option::freeze), ": pattern '", pattern, "' matches no parameter of the model");
  }
  const ParamCounts counts = count_params(units);
  if (counts.total() == 0) refuse("the model declares no parameters (its units() lists none with elements): nothing to train");
  if (counts.trainable == 0) {
    if (patterns.empty()) refuse("every parameter of the model is frozen: nothing is left to train");
    refuse(option_name(Option::freeze), ": every parameter is frozen, nothing is left to train (freeze less, or ",
           "add adapters to train)");
  }
  return units;
}

UnitSplit split_unit(const UnitSpec& unit) {
  UnitSplit split{{unit.name, {}}, {unit.name, {}}, {}};
  for (const ParamSpec& p : unit.params) {
    std::vector<ParamSpec>& part = p.frozen ? split.frozen.params : split.trainable.params;
    split.slots.push_back({p.frozen, int(part.size())});
    part.push_back(p);
  }
  return split;
}

ParamCounts count_params(const std::vector<UnitSpec>& units) {
  ParamCounts counts;
  for (const UnitSpec& unit : units)
    for (const ParamSpec& p : unit.params) (p.frozen ? counts.frozen : counts.trainable) += p.numel();
  return counts;
}

ParamCounts count_params(const Model& model, const std::vector<std::string>& freeze) {
  return count_params(freeze_matching(model.units(), freeze));
}

}  // namespace zshard
