#include <zshard/model.h>

#include <zshard/error.h>

#include "kernels/option_names.h"

namespace zshard {

int64_t num_params(const Model& model) {
  int64_t n = 0;
  for (const UnitSpec& unit : model.units()) n += unit.numel();
  return n;
}

double Model::flops_per_token(int) const { return 6.0 * double(num_params(*this)); }

bool Model::keeps_gradients_open(int, int) const { return true; }

void Model::set_recompute(Recompute mode) {
  if (mode != Recompute::none)
    throw UsageError(detail::concat(option_setting(Option::recompute, "blocks", "Recompute::blocks"),
                                    ": this model does not support recomputation (it does not override "
                                    "Model::set_recompute)"));
}

void Model::set_fused_epilogues(FusedEpilogues) {}

}  // namespace zshard
