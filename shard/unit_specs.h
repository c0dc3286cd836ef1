// What the engine checks of a model's units before it allocates anything: names a checkpoint and a weights
// file can key, shapes that are shapes, and the same units on every rank.
#pragma once
#include <vector>

#include <zshard/communicator.h>
#include <zshard/model.h>

namespace zshard {

// Error for a duplicate unit or parameter name, a parameter name no safetensors file can hold (empty, or
// its header's own "__metadata__"), or a negative dimension. Unit names key a checkpoint's tensors and
// parameter names a weights file's: found only at the first save, after the training it was to keep.
void check_unit_specs(const std::vector<UnitSpec>& specs);

// Collective over `world`: an agreed failure naming the first unit that differs between two ranks (its name,
// a parameter's name, shape or flags), or a unit count that does. Every rank must build the same model:
// units of other sizes would have the collectives exchange buffers of other sizes, which MPI reports as a
// truncated message, or not at all, far from the cause.
void check_same_units_on_every_rank(const std::vector<UnitSpec>& specs, comm::Communicator& world);

}  // namespace zshard
