// Every op's test case (tests/unit/cpu_op_check.h: the differentiable inputs, forward, and a backward that
// accumulates), one per op of ops::, used by the op-by-backend table (test_backend_ops.cpp) and by the
// op files' own forward checks. Odd sizes by default. T is double, float or bf16 (whose statistics and
// scalars are Compute<T>, fp32).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/unit/cpu_op_check.h"

namespace zshard::cpu {

using test::Arrays;
using test::add_into;
using test::grad_or_null;

struct EmbeddingCase {
  int B = 2, Tn = 5, C = 8, V = 11;
  // Repeated tokens check that the scatter accumulates.
  std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 7, 7, 1, 3, 5};
  std::vector<size_t> input_sizes() const { return {size_t(V) * C, size_t(Tn) * C}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(size_t(B) * Tn * C);
    embedding_forward(out.data(), tokens.data(), in[0].data(), in[1].data(), B, Tn, C);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    embedding_backward(grad_or_null(g[0]), grad_or_null(g[1]), dout.data(), tokens.data(), B, Tn, C);
  }
};

struct LayerNormCase {
  int N = 10, C = 8;
  std::vector<size_t> input_sizes() const { return {size_t(N) * C, size_t(C), size_t(C)}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<Compute<T>>* mean = nullptr,
                         std::vector<Compute<T>>* rstd = nullptr) const {
    std::vector<T> out(size_t(N) * C);
    std::vector<Compute<T>> mu(N), rs(N);
    layernorm_forward(out.data(), mu.data(), rs.data(), in[0].data(), in[1].data(), in[2].data(), N, C);
    if (mean) *mean = mu;
    if (rstd) *rstd = rs;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<Compute<T>> mean, rstd;
    forward(in, &mean, &rstd);
    layernorm_backward(g[0].data(), grad_or_null(g[1]), grad_or_null(g[2]), dout.data(), in[0].data(), in[1].data(),
                       mean.data(), rstd.data(), N, C);
  }
};

struct LinearCase {
  bool with_bias = true;
  int N = 10, C = 8, OC = 6;
  std::vector<size_t> input_sizes() const {
    std::vector<size_t> sizes = {size_t(N) * C, size_t(C) * OC};
    if (with_bias) sizes.push_back(OC);
    return sizes;
  }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(size_t(N) * OC);
    linear_forward(out.data(), in[0].data(), in[1].data(), with_bias ? in[2].data() : nullptr, N, C, OC);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    linear_backward(g[0].data(), grad_or_null(g[1]), with_bias ? grad_or_null(g[2]) : nullptr, dout.data(), in[0].data(),
                    in[1].data(), N, C, OC);
  }
};

// LoRA on a frozen linear layer: the differentiable inputs are inp and the adapter (A (R, C), B (OC, R));
// the frozen weight, in `layout`, and bias are the case's own fixed values, which bf16 holds exactly so that
// every T starts from the same ones. The adapter's B is random, not PEFT's zero start, so that A's
// gradient is not zero.
struct LoraLinearCase {
  WeightLayout layout = WeightLayout::in_out;
  bool with_bias = true;
  int N = 10, C = 8, OC = 6, R = 3;
  double scale = 2.0 / 3;  // lora_alpha 2 over rank 3
  std::vector<size_t> input_sizes() const { return {size_t(N) * C, size_t(R) * C, size_t(OC) * R}; }
  template <class T>
  std::vector<T> weight() const { return frozen<T>(size_t(C) * OC, 11); }
  template <class T>
  std::vector<T> bias() const { return frozen<T>(size_t(OC), 12); }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<T>* hidden = nullptr) const {
    std::vector<T> out(size_t(N) * OC), h(size_t(N) * R);
    const std::vector<T> w = weight<T>(), b = bias<T>();
    lora_linear_forward(out.data(), h.data(), in[0].data(), w.data(), with_bias ? b.data() : nullptr,
                        in[1].data(), in[2].data(), N, C, OC, R, Compute<T>(scale), layout);
    if (hidden) *hidden = h;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> hidden;
    forward(in, &hidden);
    lora_linear_backward(g[0].data(), g[1].data(), g[2].data(), dout.data(), in[0].data(), weight<T>().data(),
                         in[1].data(), in[2].data(), hidden.data(), N, C, OC, R, Compute<T>(scale), layout);
  }

 private:
  template <class T>
  static std::vector<T> frozen(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    return test::convert<T>(test::bf16_values(test::random_vector(n, rng)));
  }
};

struct GeluCase {
  size_t n = 40;
  std::vector<size_t> input_sizes() const { return {n}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(n);
    gelu_forward(out.data(), in[0].data(), n);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    gelu_backward(g[0].data(), in[0].data(), dout.data(), n);
  }
};

struct ResidualCase {
  size_t n = 40;
  std::vector<size_t> input_sizes() const { return {n, n}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(n);
    residual_forward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    residual_backward(g[0].data(), g[1].data(), dout.data(), n);
  }
};

// The output is the returned loss sum; d(output) is the op's scalar dloss. The op SETS dlogits, so the
// case adds them to the gradient itself to fit the accumulating harness.
struct CrossEntropyCase {
  int N = 6, V = 11;
  std::vector<int32_t> targets = {0, 10, 4, 4, 7, 2};
  std::vector<size_t> input_sizes() const { return {size_t(N) * V}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> losses(N);
    return {T(cross_entropy_forward_backward<T>(nullptr, losses.data(), in[0].data(), targets.data(), N, V, V, 0))};
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> dlogits(size_t(N) * V), losses(N);
    cross_entropy_forward_backward(dlogits.data(), losses.data(), in[0].data(), targets.data(), N, V, V,
                                   Compute<T>(dout[0]));
    for (size_t i = 0; i < dlogits.size(); ++i) add_into(g[0][i], dlogits[i]);
  }
};

struct AttentionCase {
  int B = 2, Tn = 5, C = 8, NH = 2;
  size_t qkv_size() const { return size_t(B) * Tn * 3 * C; }
  std::vector<size_t> input_sizes() const { return {qkv_size()}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<T>* att = nullptr) const {
    std::vector<T> out(size_t(B) * Tn * C), probs(size_t(B) * NH * Tn * Tn, T(-1));
    attention_forward(out.data(), probs.data(), in[0].data(), B, Tn, C, NH);
    if (att) *att = probs;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> att;
    forward(in, &att);
    attention_backward(g[0].data(), dout.data(), in[0].data(), att.data(), B, Tn, C, NH);
  }
};

// The same attention fused: the forward saves each row's log-sum-exp (B,NH,T) instead of the probabilities,
// and the backward, from qkv, the output and those statistics, WRITES its gradient, which the case adds to
// fit the accumulating harness.
struct FusedAttentionCase {
  int B = 2, Tn = 5, C = 8, NH = 2;
  std::vector<size_t> input_sizes() const { return {size_t(B) * Tn * 3 * C}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<Compute<T>>* lse = nullptr) const {
    std::vector<T> out(size_t(B) * Tn * C);
    std::vector<Compute<T>> stats(size_t(B) * NH * Tn);
    fused_attention_forward(out.data(), stats.data(), in[0].data(), B, Tn, C, NH);
    if (lse) *lse = stats;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<Compute<T>> lse;
    const std::vector<T> out = forward(in, &lse);
    std::vector<T> dqkv(in[0].size(), T(7));  // written whole: what was there does not matter
    fused_attention_backward(dqkv.data(), dout.data(), in[0].data(), out.data(), lse.data(), B, Tn, C, NH);
    for (size_t i = 0; i < dqkv.size(); ++i) add_into(g[0][i], dqkv[i]);
  }
};

struct RmsNormCase {
  int N = 7, C = 13;
  std::vector<size_t> input_sizes() const { return {size_t(N) * C, size_t(C)}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<Compute<T>>* rstd = nullptr) const {
    std::vector<T> out(size_t(N) * C);
    std::vector<Compute<T>> rs(N);
    rmsnorm_forward(out.data(), rs.data(), in[0].data(), in[1].data(), N, C, 1e-5f);
    if (rstd) *rstd = rs;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<Compute<T>> rstd;
    forward(in, &rstd);
    rmsnorm_backward(g[0].data(), grad_or_null(g[1]), dout.data(), in[0].data(), in[1].data(), rstd.data(), N, C);
  }
};

// In place: the case copies its input, rotates the copy, and for the backward turns dout back and adds it.
struct RopeCase {
  int B = 2, Tn = 5, NH = 3, HS = 6;
  ops::RopeFrequencies freq;
  std::vector<size_t> input_sizes() const { return {size_t(B) * Tn * NH * HS}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> x = in[0];
    rope_forward(x.data(), B, Tn, NH, HS, freq);
    return x;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> d = dout;
    rope_backward(d.data(), B, Tn, NH, HS, freq);
    for (size_t i = 0; i < d.size(); ++i) add_into(g[0][i], d[i]);
  }
};

struct GqaPackCase {
  int B = 2, Tn = 3, NH = 6, NKV = 2, HS = 5;
  std::vector<size_t> input_sizes() const {
    const size_t rows = size_t(B) * Tn;
    return {rows * NH * HS, rows * NKV * HS, rows * NKV * HS};
  }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> qkv(size_t(B) * Tn * 3 * NH * HS);
    gqa_pack(qkv.data(), in[0].data(), in[1].data(), in[2].data(), B, Tn, NH, NKV, HS);
    return qkv;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    gqa_pack_backward(g[0].data(), g[1].data(), g[2].data(), dout.data(), B, Tn, NH, NKV, HS);
  }
};

struct SwigluCase {
  size_t n = 37;
  InputGrad mode = InputGrad::accumulate;  // set: the op writes arrays of its own, which the case adds
  std::vector<size_t> input_sizes() const { return {n, n}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(n);
    swiglu_forward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    if (mode == InputGrad::accumulate)
      return swiglu_backward(g[0].data(), g[1].data(), dout.data(), in[0].data(), in[1].data(), n);
    std::vector<T> dgate(n, T(7)), dup(n, T(7));  // stale values, which setting must not keep
    swiglu_backward(dgate.data(), dup.data(), dout.data(), in[0].data(), in[1].data(), n, mode);
    for (size_t i = 0; i < n; ++i) {
      add_into(g[0][i], dgate[i]);
      add_into(g[1][i], dup[i]);
    }
  }
};

// The linear layer with its epilogues, no GELU. Its backward sets dinp: the case passes an array of stale
// values, which must not survive, and adds the result to the gradient.
struct LinearEpilogueCase : LinearCase {  // LinearCase's shape and inputs
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(size_t(N) * OC);
    linear_epilogue_forward(out.data(), static_cast<T*>(nullptr), in[0].data(), in[1].data(),
                            with_bias ? in[2].data() : nullptr, N, C, OC);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> dinp(in[0].size(), T(7));
    linear_epilogue_backward(dinp.data(), grad_or_null(g[1]), with_bias ? grad_or_null(g[2]) : nullptr,
                             static_cast<T*>(nullptr), dout.data(), in[0].data(), static_cast<const T*>(nullptr),
                             in[1].data(), N, C, OC);
    for (size_t i = 0; i < dinp.size(); ++i) add_into(g[0][i], dinp[i]);
  }
};

// GPT-2's MLP through the epilogues: out = gelu(x @ W1 + b1) @ W2 + b2, inputs x, W1, b1, W2, b2. The second
// layer's backward goes through the GELU and takes b1's gradient; the first's is a plain one without bias.
struct GeluMlpCase {
  int N = 10, C = 8, H = 16, OC = 6;
  std::vector<size_t> input_sizes() const {
    return {size_t(N) * C, size_t(C) * H, size_t(H), size_t(H) * OC, size_t(OC)};
  }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<T>* hidden = nullptr, std::vector<T>* pre = nullptr) const {
    std::vector<T> h(size_t(N) * H), p(h.size()), out(size_t(N) * OC);
    linear_epilogue_forward(h.data(), p.data(), in[0].data(), in[1].data(), in[2].data(), N, C, H);
    linear_epilogue_forward(out.data(), static_cast<T*>(nullptr), h.data(), in[3].data(), in[4].data(), N, H, OC);
    if (hidden) *hidden = h;
    if (pre) *pre = p;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<T> h, pre;
    forward(in, &h, &pre);
    std::vector<T> dpre(pre.size(), T(7)), dx(in[0].size(), T(7));  // set by the ops: stale values first
    linear_epilogue_backward(dpre.data(), grad_or_null(g[3]), grad_or_null(g[4]), grad_or_null(g[2]), dout.data(),
                             h.data(), pre.data(), in[3].data(), N, H, OC);
    linear_epilogue_backward(dx.data(), grad_or_null(g[1]), static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                             dpre.data(), in[0].data(), static_cast<const T*>(nullptr), in[1].data(), N, C, H);
    for (size_t i = 0; i < dx.size(); ++i) add_into(g[0][i], dx[i]);
  }
};

// The residual add inside a norm: the output is [residual | normalised], and a and b share the residual's
// gradient, which is its own plus what the norm's backward adds.
template <bool kRms>
struct NormResidualCase {
  int N = 7, C = 13;
  size_t rows() const { return size_t(N) * C; }
  std::vector<size_t> input_sizes() const {
    std::vector<size_t> sizes = {rows(), rows(), size_t(C)};
    if (!kRms) sizes.push_back(C);
    return sizes;
  }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in, std::vector<Compute<T>>* mean = nullptr,
                         std::vector<Compute<T>>* rstd = nullptr) const {
    std::vector<T> out(2 * rows());
    std::vector<Compute<T>> mu(N), rs(N);
    if constexpr (kRms)
      rmsnorm_residual_forward(out.data(), out.data() + rows(), rs.data(), in[0].data(), in[1].data(), in[2].data(), N,
                               C, 1e-5f);
    else
      layernorm_residual_forward(out.data(), out.data() + rows(), mu.data(), rs.data(), in[0].data(), in[1].data(),
                                 in[2].data(), in[3].data(), N, C);
    if (mean) *mean = mu;
    if (rstd) *rstd = rs;
    return out;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    std::vector<Compute<T>> mean, rstd;
    const std::vector<T> out = forward(in, &mean, &rstd);
    std::vector<T> dres(dout.begin(), dout.begin() + rows());
    const T* dnorm = dout.data() + rows();
    if constexpr (kRms)
      rmsnorm_backward(dres.data(), grad_or_null(g[2]), dnorm, out.data(), in[2].data(), rstd.data(), N, C);
    else
      layernorm_backward(dres.data(), grad_or_null(g[2]), grad_or_null(g[3]), dnorm, out.data(), in[2].data(),
                         mean.data(), rstd.data(), N, C);
    for (size_t i = 0; i < rows(); ++i) {
      add_into(g[0][i], dres[i]);
      add_into(g[1][i], dres[i]);
    }
  }
};
using LayerNormResidualCase = NormResidualCase<false>;
using RmsNormResidualCase = NormResidualCase<true>;

struct TokenEmbeddingCase {  // no position table
  int B = 2, Tn = 5, C = 7, V = 11;
  std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 7, 7, 1, 3, 5};
  std::vector<size_t> input_sizes() const { return {size_t(V) * C}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> out(size_t(B) * Tn * C);
    embedding_forward<T>(out.data(), tokens.data(), in[0].data(), nullptr, B, Tn, C);
    return out;
  }
  template <class T>
  void backward(const Arrays<T>&, const std::vector<T>& dout, Arrays<T>& g) const {
    embedding_backward<T>(g[0].data(), nullptr, dout.data(), tokens.data(), B, Tn, C);
  }
};

// `full` with the inputs `frozen` (indices into full's) held at fixed values and given no gradient: their
// backward arrays are null, as a frozen parameter's (ParamContext::grads). Its inputs are full's others. The
// fixed values are ones bf16 holds, so that every T starts from the same.
template <class Case>
struct FrozenCase {
  Case full;
  std::vector<size_t> frozen;

  bool is_frozen(size_t i) const { return std::find(frozen.begin(), frozen.end(), i) != frozen.end(); }
  std::vector<size_t> input_sizes() const {
    std::vector<size_t> sizes;
    const std::vector<size_t> all = full.input_sizes();
    for (size_t i = 0; i < all.size(); ++i)
      if (!is_frozen(i)) sizes.push_back(all[i]);
    return sizes;
  }
  // full's inputs: `in` with the frozen ones put back.
  template <class T>
  Arrays<T> full_inputs(const Arrays<T>& in) const {
    Arrays<T> all;
    const std::vector<size_t> sizes = full.input_sizes();
    for (size_t i = 0, next = 0; i < sizes.size(); ++i) {
      std::mt19937 rng(unsigned(100 + i));
      all.push_back(is_frozen(i) ? test::convert<T>(test::bf16_values(test::random_vector(sizes[i], rng)))
                                 : in[next++]);
    }
    return all;
  }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    return full.template forward<T>(full_inputs(in));
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dout, Arrays<T>& g) const {
    Arrays<T> all_grads;
    const size_t n = full.input_sizes().size();
    for (size_t i = 0, next = 0; i < n; ++i) all_grads.push_back(is_frozen(i) ? std::vector<T>{} : std::move(g[next++]));
    full.template backward<T>(full_inputs(in), dout, all_grads);
    for (size_t i = 0, next = 0; i < n; ++i)
      if (!is_frozen(i)) g[next++] = std::move(all_grads[i]);
  }
};

// The frozen case's gradients are the full op's, bit for bit, in every T: a frozen parameter's skipped
// gradient changes nothing of the others, the input gradient included.
template <class Case>
void expect_frozen_matches_full(const FrozenCase<Case>& c, unsigned seed = 4) {
  const auto check = [&]<class T>(T) {
    std::mt19937 rng(seed);
    Arrays<T> in;
    for (size_t n : c.input_sizes()) in.push_back(test::convert<T>(test::bf16_values(test::random_vector(n, rng))));
    const Arrays<T> all_in = c.full_inputs(in);
    const std::vector<T> out = c.full.template forward<T>(all_in);
    const std::vector<T> dout = test::convert<T>(test::bf16_values(test::random_vector(out.size(), rng)));
    Arrays<T> full_grads = test::zeros_like(all_in), grads = test::zeros_like(in);
    c.full.template backward<T>(all_in, dout, full_grads);
    c.template backward<T>(in, dout, grads);
    for (size_t i = 0, next = 0; i < all_in.size(); ++i)
      if (!c.is_frozen(i)) {
        const std::vector<T>& g = grads[next++];
        EXPECT_EQ(std::memcmp(g.data(), full_grads[i].data(), g.size() * sizeof(T)), 0)
            << dtype_name(dtype_of<T>()) << " gradient of input " << i;
      }
  };
  check(double{});
  check(float{});
  check(bf16{});
}

}  // namespace zshard::cpu
