// Frozen parameters: which ones (ParamSpec::frozen and EngineOptions::freeze's name patterns), and how a
// unit is split so that gradients, master weights and Adam state cover its trainable parameters only.
//
// A unit keeps two flat buffers: the trainable parameters' (FlatLayout, what grads, AdamW, checkpoints
// and the gradient norm see, exactly as a unit without frozen parameters) and the frozen parameters'
// (the compute copy only, sharded and gathered like the other). Two buffers rather than one with the
// frozen elements at its end: a shard of one buffer would hold some of each, and the gradient's
// reduce-scatter would then carry the frozen part's zeros.
#pragma once
#include <string>
#include <vector>

#include <zshard/model.h>

namespace zshard {

// `*` matches any run of characters, dots included: "h.*.ln_*" matches "h.0.ln_1.weight".
bool name_matches(const std::string& pattern, const std::string& name);

// The model's units with ParamSpec::frozen set where a pattern matches the parameter's name. Refuses
// (UsageError) a pattern that matches no parameter, and a model left with nothing to train.
std::vector<UnitSpec> freeze_matching(std::vector<UnitSpec> units, const std::vector<std::string>& patterns);

// Where each of a unit's parameters (UnitSpec order) went: its split part and index there.
struct ParamSlot {
  bool frozen;
  int index;
};

struct UnitSplit {
  UnitSpec trainable;  // the unit's name, its trainable parameters in order
  UnitSpec frozen;     // the unit's name, its frozen parameters in order
  std::vector<ParamSlot> slots;
};

UnitSplit split_unit(const UnitSpec& unit);

// Element counts of the parameters, split: what the memory estimator and reports use.
struct ParamCounts {
  int64_t trainable = 0;
  int64_t frozen = 0;
  int64_t total() const { return trainable + frozen; }
};
ParamCounts count_params(const std::vector<UnitSpec>& units);
// The model's, with `freeze`'s patterns frozen beside what ParamSpec::frozen marks (freeze_matching).
ParamCounts count_params(const Model& model, const std::vector<std::string>& freeze);

}  // namespace zshard
