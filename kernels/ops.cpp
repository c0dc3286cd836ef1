#include <zshard/ops.h>

#include <string>
#include <type_traits>

#include "kernels/op_dispatch.h"

namespace zshard::ops {

using namespace dispatch;

template <class T>
void embedding_forward(Device d, T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn,
                       int C) {
  if (on_cpu<T>(d, "embedding_forward")) {
    ZS_ON_CPU(T, cpu::embedding_forward(out, tokens, wte, wpe, B, Tn, C))
  } else {
    ZS_ON_CUDA(T, cuda::embedding_forward(dev(out), tokens, dev(wte), dev(wpe), B, Tn, C))
  }
}

template <class T>
void embedding_backward(Device d, T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn,
                        int C) {
  if (on_cpu<T>(d, "embedding_backward")) {
    ZS_ON_CPU(T, cpu::embedding_backward(dwte, dwpe, dout, tokens, B, Tn, C))
  } else {
    ZS_ON_CUDA(T, cuda::embedding_backward(dev(dwte), dev(dwpe), dev(dout), tokens, B, Tn, C))
  }
}

template <class T>
void layernorm_forward(Device d, T* out, NormStat<T>* mean, NormStat<T>* rstd, const T* inp, const T* weight,
                       const T* bias, int N, int C) {
  if (on_cpu<T>(d, "layernorm_forward")) {
    ZS_ON_CPU(T, cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C))
  } else {
    ZS_ON_CUDA(T, cuda::layernorm_forward(dev(out), mean, rstd, dev(inp), dev(weight), dev(bias), N, C))
  }
}

template <class T>
void layernorm_backward(Device d, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const NormStat<T>* mean, const NormStat<T>* rstd, int N, int C) {
  if (on_cpu<T>(d, "layernorm_backward")) {
    ZS_ON_CPU(T, cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))
  } else {
    ZS_ON_CUDA(T, cuda::layernorm_backward(dev(dinp), dev(dweight), dev(dbias), dev(dout), dev(inp),
                                           dev(weight), mean, rstd, N, C))
  }
}

template <class T>
void rmsnorm_forward(Device d, T* out, NormStat<T>* rstd, const T* inp, const T* weight, int N, int C, float eps) {
  if (on_cpu<T>(d, "rmsnorm_forward")) {
    ZS_ON_CPU(T, cpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps))
  } else {
    ZS_ON_CUDA(T, cuda::rmsnorm_forward(dev(out), rstd, dev(inp), dev(weight), N, C, eps))
  }
}

template <class T>
void rmsnorm_backward(Device d, T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const NormStat<T>* rstd, int N, int C) {
  if (on_cpu<T>(d, "rmsnorm_backward")) {
    ZS_ON_CPU(T, cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C))
  } else {
    ZS_ON_CUDA(T, cuda::rmsnorm_backward(dev(dinp), dev(dweight), dev(dout), dev(inp), dev(weight), rstd, N, C))
  }
}

template <class T>
void rope_forward(Device d, T* x, int B, int Tn, int NH, int HS, const RopeFrequencies& rope) {
  if (on_cpu<T>(d, "rope_forward")) {
    ZS_ON_CPU(T, cpu::rope_forward(x, B, Tn, NH, HS, rope))
  } else {
    ZS_ON_CUDA(T, cuda::rope_forward(dev(x), B, Tn, NH, HS, rope))
  }
}

template <class T>
void rope_backward(Device d, T* dx, int B, int Tn, int NH, int HS, const RopeFrequencies& rope) {
  if (on_cpu<T>(d, "rope_backward")) {
    ZS_ON_CPU(T, cpu::rope_backward(dx, B, Tn, NH, HS, rope))
  } else {
    ZS_ON_CUDA(T, cuda::rope_backward(dev(dx), B, Tn, NH, HS, rope))
  }
}

template <class T>
void gqa_pack(Device d, T* qkv, const T* q, const T* k, const T* v, int B, int Tn, int NH, int NKV, int HS) {
  if (on_cpu<T>(d, "gqa_pack")) {
    ZS_ON_CPU(T, cpu::gqa_pack(qkv, q, k, v, B, Tn, NH, NKV, HS))
  } else {
    ZS_ON_CUDA(T, cuda::gqa_pack(dev(qkv), dev(q), dev(k), dev(v), B, Tn, NH, NKV, HS))
  }
}

template <class T>
void gqa_pack_backward(Device d, T* dq, T* dk, T* dv, const T* dqkv, int B, int Tn, int NH, int NKV, int HS) {
  if (on_cpu<T>(d, "gqa_pack_backward")) {
    ZS_ON_CPU(T, cpu::gqa_pack_backward(dq, dk, dv, dqkv, B, Tn, NH, NKV, HS))
  } else {
    ZS_ON_CUDA(T, cuda::gqa_pack_backward(dev(dq), dev(dk), dev(dv), dev(dqkv), B, Tn, NH, NKV, HS))
  }
}

template <class T>
void swiglu_forward(Device d, T* out, const T* gate, const T* up, size_t n) {
  if (on_cpu<T>(d, "swiglu_forward")) {
    ZS_ON_CPU(T, cpu::swiglu_forward(out, gate, up, n))
  } else {
    ZS_ON_CUDA(T, cuda::swiglu_forward(dev(out), dev(gate), dev(up), n))
  }
}

template <class T>
void swiglu_backward(Device d, T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n,
                     InputGrad mode) {
  if (on_cpu<T>(d, "swiglu_backward")) {
    ZS_ON_CPU(T, cpu::swiglu_backward(dgate, dup, dout, gate, up, n, mode))
  } else {
    ZS_ON_CUDA(T, cuda::swiglu_backward(dev(dgate), dev(dup), dev(dout), dev(gate), dev(up), n, mode))
  }
}

template <class T>
void linear_forward(Device d, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  if (on_cpu<T>(d, "linear_forward")) {
    ZS_ON_CPU(T, cpu::linear_forward(out, inp, weight, bias, N, C, OC))
  } else {
    ZS_ON_CUDA(T, cuda::linear_forward(dev(out), dev(inp), dev(weight), dev(bias), N, C, OC))
  }
}

template <class T>
void linear_backward(Device d, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC) {
  if (on_cpu<T>(d, "linear_backward")) {
    ZS_ON_CPU(T, cpu::linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC))
  } else {
    ZS_ON_CUDA(T, cuda::linear_backward(dev(dinp), dev(dweight), dev(dbias), dev(dout), dev(inp), dev(weight),
                                        N, C, OC))
  }
}

template <class T>
void lora_linear_forward(Device d, T* out, T* lora_hidden, const T* inp, const T* weight, const T* bias,
                         const T* lora_a, const T* lora_b, int N, int C, int OC, int R, float scale,
                         WeightLayout layout) {
  if (on_cpu<T>(d, "lora_linear_forward")) {
    ZS_ON_CPU(T, cpu::lora_linear_forward(out, lora_hidden, inp, weight, bias, lora_a, lora_b, N, C, OC, R,
                                          cpu_scalar<T>(scale), layout))
  } else {
    ZS_ON_CUDA(T, cuda::lora_linear_forward(dev(out), dev(lora_hidden), dev(inp), dev(weight), dev(bias),
                                            dev(lora_a), dev(lora_b), N, C, OC, R, scale, layout))
  }
}

template <class T>
void lora_linear_backward(Device d, T* dinp, T* dlora_a, T* dlora_b, const T* dout, const T* inp,
                          const T* weight, const T* lora_a, const T* lora_b, const T* lora_hidden, int N, int C,
                          int OC, int R, float scale, WeightLayout layout) {
  if (on_cpu<T>(d, "lora_linear_backward")) {
    ZS_ON_CPU(T, cpu::lora_linear_backward(dinp, dlora_a, dlora_b, dout, inp, weight, lora_a, lora_b,
                                           lora_hidden, N, C, OC, R, cpu_scalar<T>(scale), layout))
  } else {
    ZS_ON_CUDA(T, cuda::lora_linear_backward(dev(dinp), dev(dlora_a), dev(dlora_b), dev(dout), dev(inp),
                                             dev(weight), dev(lora_a), dev(lora_b), dev(lora_hidden), N, C, OC,
                                             R, scale, layout))
  }
}

template <class T>
void gemm(Device d, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
          const T* B, int ldb, float beta, T* C, int ldc) {
  if (on_cpu<T>(d, "gemm")) {
    ZS_ON_CPU(T, cpu::gemm(trans_a, trans_b, M, N, K, cpu_scalar<T>(alpha), A, lda, B, ldb, cpu_scalar<T>(beta),
                           C, ldc))
  } else {
    ZS_ON_CUDA(T, cuda::gemm(trans_a, trans_b, M, N, K, alpha, dev(A), lda, dev(B), ldb,
                             beta, dev(C), ldc))
  }
}

template <class T>
void attention_forward(Device d, T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  if (on_cpu<T>(d, "attention_forward")) {
    ZS_ON_CPU(T, cpu::attention_forward(out, att, qkv, B, Tn, C, NH))
  } else {
    ZS_ON_CUDA(T, cuda::attention_forward(dev(out), dev(att), dev(qkv), B, Tn, C, NH))
  }
}

template <class T>
void attention_backward(Device d, T* dqkv, const T* dout, const T* qkv, const T* att, int B, int Tn, int C,
                        int NH) {
  if (on_cpu<T>(d, "attention_backward")) {
    ZS_ON_CPU(T, cpu::attention_backward(dqkv, dout, qkv, att, B, Tn, C, NH))
  } else {
    ZS_ON_CUDA(T, cuda::attention_backward(dev(dqkv), dev(dout), dev(qkv), dev(att), B, Tn, C, NH))
  }
}

std::string fused_attention_unavailable(Device device, DType dtype) {
  if (device == Device::cpu) {
    if (dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16) return "";
    return detail::concat("fused attention on cpu computes in f32, f64 or bf16, not ", dtype_name(dtype));
  }
#ifndef ZSHARD_WITH_CUDA
  return "this zshard was built without the CUDA path";
#else
  // cuDNN's SDPA kernels take 16-bit inputs: fp32 keeps the blocks path (kernels/cuda/attention.cu).
  if (dtype != DType::bf16) return detail::concat("fused attention on cuda is bf16 only, not ", dtype_name(dtype));
#ifdef ZSHARD_WITH_CUDNN
  return cuda::cudnn_unavailable();
#else
  return "this zshard was built without cuDNN's frontend headers (scripts/install-deps.sh fetches them)";
#endif
#endif
}

namespace {
void check_fused_attention_runs(const char* op, Device d, DType dtype) {
  if (const std::string why = fused_attention_unavailable(d, dtype); !why.empty()) fail(op, ": ", why);
}
}  // namespace

template <class T>
void fused_attention_forward(Device d, T* out, AttentionStat<T>* lse, const T* qkv, int B, int Tn, int C, int NH) {
  if (on_cpu<T>(d, "fused_attention_forward")) {
    ZS_ON_CPU(T, cpu::fused_attention_forward(out, lse, qkv, B, Tn, C, NH))
    return;
  }
  check_fused_attention_runs("fused_attention_forward", d, dtype_of<T>());
#if defined(ZSHARD_WITH_CUDA) && defined(ZSHARD_WITH_CUDNN)
  if constexpr (std::is_same_v<T, bf16>) cuda::fused_attention_forward(dev(out), lse, dev(qkv), B, Tn, C, NH);
#endif
}

template <class T>
void fused_attention_backward(Device d, T* dqkv, const T* dout, const T* qkv, const T* out,
                              const AttentionStat<T>* lse, int B, int Tn, int C, int NH) {
  if (on_cpu<T>(d, "fused_attention_backward")) {
    ZS_ON_CPU(T, cpu::fused_attention_backward(dqkv, dout, qkv, out, lse, B, Tn, C, NH))
    return;
  }
  check_fused_attention_runs("fused_attention_backward", d, dtype_of<T>());
#if defined(ZSHARD_WITH_CUDA) && defined(ZSHARD_WITH_CUDNN)
  if constexpr (std::is_same_v<T, bf16>)
    cuda::fused_attention_backward(dev(dqkv), dev(dout), dev(qkv), dev(out), lse, B, Tn, C, NH);
#endif
}

template <class T>
void gelu_forward(Device d, T* out, const T* inp, size_t n) {
  if (on_cpu<T>(d, "gelu_forward")) {
    ZS_ON_CPU(T, cpu::gelu_forward(out, inp, n))
  } else {
    ZS_ON_CUDA(T, cuda::gelu_forward(dev(out), dev(inp), n))
  }
}

template <class T>
void gelu_backward(Device d, T* dinp, const T* inp, const T* dout, size_t n) {
  if (on_cpu<T>(d, "gelu_backward")) {
    ZS_ON_CPU(T, cpu::gelu_backward(dinp, inp, dout, n))
  } else {
    ZS_ON_CUDA(T, cuda::gelu_backward(dev(dinp), dev(inp), dev(dout), n))
  }
}

template <class T>
void residual_forward(Device d, T* out, const T* a, const T* b, size_t n) {
  if (on_cpu<T>(d, "residual_forward")) {
    ZS_ON_CPU(T, cpu::residual_forward(out, a, b, n))
  } else {
    ZS_ON_CUDA(T, cuda::residual_forward(dev(out), dev(a), dev(b), n))
  }
}

template <class T>
double cross_entropy_forward_backward(Device d, T* dlogits, T* losses, const T* logits,
                                      const int32_t* targets, int N, int V, int ld, float dloss,
                                      double* loss_sum) {
  if (on_cpu<T>(d, "cross_entropy_forward_backward")) {
    ZS_ON_CPU(T, {
      const double sum =
          cpu::cross_entropy_forward_backward(dlogits, losses, logits, targets, N, V, ld, cpu_scalar<T>(dloss));
      if (!loss_sum) return sum;
      *loss_sum += sum;
      return 0.0;
    })
  } else {
    ZS_ON_CUDA(T, return cuda::cross_entropy_forward_backward(dev(dlogits), dev(losses), dev(logits), targets,
                                                              N, V, ld, dloss, loss_sum))
  }
  fail("cross_entropy_forward_backward: no backend for ", dtype_name(dtype_of<T>()));
}

#define ZS_INSTANTIATE(T)                                                                                    \
  template void embedding_forward<T>(Device, T*, const int32_t*, const T*, const T*, int, int, int);        \
  template void embedding_backward<T>(Device, T*, T*, const T*, const int32_t*, int, int, int);            \
  template void layernorm_forward<T>(Device, T*, NormStat<T>*, NormStat<T>*, const T*, const T*, const T*, \
                                     int, int);                                                             \
  template void layernorm_backward<T>(Device, T*, T*, T*, const T*, const T*, const T*, const NormStat<T>*, \
                                      const NormStat<T>*, int, int);                                                           \
  template void rmsnorm_forward<T>(Device, T*, NormStat<T>*, const T*, const T*, int, int, float);         \
  template void rmsnorm_backward<T>(Device, T*, T*, const T*, const T*, const T*, const NormStat<T>*, int, int); \
  template void rope_forward<T>(Device, T*, int, int, int, int, const RopeFrequencies&);                   \
  template void rope_backward<T>(Device, T*, int, int, int, int, const RopeFrequencies&);                  \
  template void gqa_pack<T>(Device, T*, const T*, const T*, const T*, int, int, int, int, int);             \
  template void gqa_pack_backward<T>(Device, T*, T*, T*, const T*, int, int, int, int, int);                \
  template void swiglu_forward<T>(Device, T*, const T*, const T*, size_t);                                   \
  template void swiglu_backward<T>(Device, T*, T*, const T*, const T*, const T*, size_t, InputGrad);         \
  template void linear_forward<T>(Device, T*, const T*, const T*, const T*, int, int, int);                 \
  template void linear_backward<T>(Device, T*, T*, T*, const T*, const T*, const T*, int, int, int);        \
  template void lora_linear_forward<T>(Device, T*, T*, const T*, const T*, const T*, const T*, const T*, int, \
                                       int, int, int, float, WeightLayout);                                 \
  template void lora_linear_backward<T>(Device, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                        const T*, int, int, int, int, float, WeightLayout);                 \
  template void gemm<T>(Device, bool, bool, int, int, int, float, const T*, int, const T*, int, float, T*,  \
                        int);                                                                              \
  template void attention_forward<T>(Device, T*, T*, const T*, int, int, int, int);                         \
  template void attention_backward<T>(Device, T*, const T*, const T*, const T*, int, int, int, int);        \
  template void fused_attention_forward<T>(Device, T*, AttentionStat<T>*, const T*, int, int, int, int);  \
  template void fused_attention_backward<T>(Device, T*, const T*, const T*, const T*, const AttentionStat<T>*, \
                                            int, int, int, int);                                           \
  template void gelu_forward<T>(Device, T*, const T*, size_t);                                               \
  template void gelu_backward<T>(Device, T*, const T*, const T*, size_t);                                    \
  template void residual_forward<T>(Device, T*, const T*, const T*, size_t);                                 \
  template double cross_entropy_forward_backward<T>(Device, T*, T*, const T*, const int32_t*, int, int,     \
                                                    int, float, double*);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::ops
