#include <zshard/model.h>

#include <zshard/error.h>
#include <zshard/ops.h>

#include "kernels/cpu/ops.h"
#include "kernels/option_names.h"

namespace zshard {

int64_t num_params(const Model& model) {
  int64_t n = 0;
  for (const UnitSpec& unit : model.units()) n += unit.numel();
  return n;
}

void check_batch(std::string_view model, const Batch& batch, int vocab, int ctx) {
  // The caller's input, so UsageErrors: the message starts with the model, not with this file's line.
  if (batch.B <= 0 || batch.T <= 0) refuse(model, " batch: B and T must be positive, got B=", batch.B, " T=", batch.T);
  if (batch.T > ctx) refuse(model, " batch: sequence length T=", batch.T, " exceeds the context ", ctx);
  if (!batch.inputs || !batch.targets) refuse(model, " batch: inputs and targets must both be given");
  const int64_t n = int64_t(batch.B) * batch.T;
  for (const auto& [tokens, what] : {std::pair{batch.inputs, "input"}, std::pair{batch.targets, "target"}})
    for (int64_t i = 0; i < n; ++i)
      if (tokens[i] < 0 || tokens[i] >= vocab)
        refuse(model, " batch: ", what, " token ", tokens[i], " at position ", i, " is outside the vocabulary [0, ",
               vocab, ")");
}

double Model::flops_per_token(int) const { return 6.0 * double(num_params(*this)); }

bool Model::keeps_gradients_open(int, int) const { return true; }

WorkspaceBytes Model::workspace_bytes(int B, int T, DType dtype, Device device) const {
  if (device != Device::cpu || dtype != DType::bf16) return {};
  const int64_t loss = cpu::bf16_cross_entropy_scratch_bytes(int64_t(B) * T, vocab_size());
  return {loss, loss, 0};
}

void Model::set_recompute(Recompute mode) {
  if (mode != Recompute::none)
    throw UsageError(detail::concat(option_setting(Option::recompute, "blocks", "Recompute::blocks"),
                                    ": this model does not support recomputation (it does not override "
                                    "Model::set_recompute)"));
}

void Model::set_attention(AttentionKernel kernel) {
  if (kernel == AttentionKernel::fused)
    throw UsageError(detail::concat(option_setting(Option::attention, "fused", "AttentionKernel::fused"),
                                    ": this model has no fused attention (it does not override "
                                    "Model::set_attention)"));
}

AttentionKernel choose_attention(Model& model, AttentionKernel requested, Device device, DType dtype,
                                 std::string* fallback) {
  const std::string why = ops::fused_attention_unavailable(device, dtype);
  if (fallback) fallback->clear();
  if (requested == AttentionKernel::fused && !why.empty())
    throw UsageError(detail::concat(option_setting(Option::attention, "fused", "AttentionKernel::fused"), ": ", why));
  if (requested == AttentionKernel::automatic && why.empty()) {
    try {
      model.set_attention(AttentionKernel::fused);
      return AttentionKernel::fused;
    } catch (const UsageError&) {
      // A model without a fused path: automatic means its own.
    }
  }
  // fp32 on a GPU keeps blocks by design (--help says so); a bf16 run without cuDNN is worth a line.
  if (fallback && requested == AttentionKernel::automatic && dtype == DType::bf16) *fallback = why;
  const AttentionKernel kernel = requested == AttentionKernel::fused ? requested : AttentionKernel::blocks;
  model.set_attention(kernel);
  return kernel;
}
void Model::set_fused_epilogues(FusedEpilogues) {}

}  // namespace zshard
