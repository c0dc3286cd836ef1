// Element types and devices a Tensor can have.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zshard {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, u16 };
enum class Device : uint8_t { cpu, cuda };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
  }
  return "?";
}

constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

// bfloat16 as stored: the upper 16 bits of an IEEE float, the same bits as CUDA's __nv_bfloat16. No
// arithmetic of its own: ops widen it to fp32 and round their results back.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  // Round to nearest, ties to even, as __float2bfloat16 does; NaN stays a (quiet) NaN.
  explicit bf16(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = uint16_t((u >> 16) | 0x40u);
      return;
    }
    bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  explicit operator float() const { return std::bit_cast<float>(uint32_t(bits) << 16); }
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }

}  // namespace zshard
