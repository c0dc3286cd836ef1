#include <zshard/train.h>

// A model of one's own on zshard, through the public headers and the one call only: an embedding (token
// and position) and a linear head predicting the next token. zshard::train_main turns this binary into a
// full trainer for it: every zshard-train flag (--strategy, --grad-accum, --save-dir, --resume,
// --mem-report, ...), and `own_model bench ...` / `own_model mem ...` as zshard-bench and zshard-mem.

using namespace zshard;

class Bigram final : public Model {
 public:
  Bigram(int vocab, int dim, int ctx) : V_(vocab), C_(dim), ctx_(ctx) {}

  std::vector<UnitSpec> units() const override {
    return {{"embed", {{"wte", {V_, C_}, true}, {"wpe", {ctx_, C_}, true}}},
            {"head", {{"head.weight", {C_, V_}, true}, {"head.bias", {V_}, false}}}};
  }
  void init_unit(int unit, const UnitTensors& params, uint64_t seed) const override {
    uint64_t state = seed * 2654435761u + uint64_t(unit);
    for (const Tensor& t : params)
      for (int64_t i = 0; i < t.numel(); ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;  // uniform in [-0.1, 0.1]
        t.data<float>()[i] = t.shape().size() == 2 ? 0.1f * (float(state >> 40) / float(1 << 23) - 1.0f) : 0.0f;
      }
  }
  double forward_backward(ParamContext& ctx, const Batch& b, float loss_scale) override {
    return run(ctx, b, loss_scale, true);
  }
  double forward(ParamContext& ctx, const Batch& b) override { return run(ctx, b, 0.0f, false); }
  // What run() allocates: x, dx, logits and the token losses, f32.
  int64_t activation_bytes(int B, int T, DType) const override { return int64_t(B) * T * (2 * C_ + V_ + 1) * 4; }
  // Each unit's gradients are made ready before the next unit's are asked for: the estimator need not
  // count a gradient held open through backward (the default's safe side, for a tied head).
  bool keeps_gradients_open(int, int) const override { return false; }
  int vocab_size() const override { return V_; }
  int context_length() const override { return ctx_; }

 private:
  // f32, on the cpu: the batch's tokens are host memory. Activations go through the tracking allocator, so
  // the memory report counts them.
  double run(ParamContext& ctx, const Batch& b, float loss_scale, bool backward) {
    const Device d = ctx.device();
    const int N = b.B * b.T;
    const auto activation = [&](int64_t cols) {
      return Tensor::zeros({N, cols}, DType::f32, d, Category::activations);
    };
    const Tensor x = activation(C_), logits = activation(V_), losses = activation(1);
    float *xs = x.data<float>(), *ls = logits.data<float>();
    const UnitTensors& emb = ctx.gather(0);
    ops::embedding_forward(d, xs, b.inputs, emb[0].data<float>(), emb[1].data<float>(), b.B, b.T, C_);
    ctx.release(0);
    const UnitTensors& head = ctx.gather(1);
    ops::linear_forward(d, ls, xs, head[0].data<float>(), head[1].data<float>(), N, C_, V_);
    const double loss = ops::cross_entropy_forward_backward(d, backward ? ls : nullptr, losses.data<float>(),
                                                            ls, b.targets, N, V_, V_, loss_scale);
    if (backward) {
      const Tensor dx = activation(C_);
      float* dxs = dx.data<float>();
      const UnitTensors& g = ctx.grads(1);
      ops::linear_backward(d, dxs, g[0].data<float>(), g[1].data<float>(), ls, xs, head[0].data<float>(), N, C_, V_);
      ctx.release(1);
      ctx.grads_ready(1);
      const UnitTensors& ge = ctx.grads(0);  // the embedding's backward needs no parameters
      ops::embedding_backward(d, ge[0].data<float>(), ge[1].data<float>(), dxs, b.inputs, b.B, b.T, C_);
      ctx.grads_ready(0);
    } else {
      ctx.release(1);
    }
    return loss;
  }

  int V_, C_, ctx_;
};

int main(int argc, char** argv) {
  return train_main(argc, argv, "bigram", {{"vocab", 256}, {"dim", 32}, {"ctx", 64}}, [](const ModelConfig& c) {
    return std::make_unique<Bigram>(int(c.at("vocab").integer()), int(c.at("dim").integer()), int(c.at("ctx").integer()));
  });
}
