// Element types and devices a Tensor can have.
#pragma once
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

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }

}  // namespace zshard
