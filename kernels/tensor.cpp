#include <zshard/tensor.h>

#include <cstring>
#include <sstream>

#include "kernels/device_memory.h"

namespace zshard {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ')';
  return os.str();
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device, Category category) {
  for (int64_t d : shape) ZS_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.buffer_ = std::make_shared<Buffer>(t.nbytes(), device, category);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device, Category category) {
  Tensor t = empty(std::move(shape), dtype, device, category);
  t.zero_();
  return t;
}

Tensor Tensor::view(int64_t offset, Shape shape) const {
  ZS_CHECK(defined(), "view of an undefined tensor");
  ZS_CHECK(offset >= 0 && offset + shape_numel(shape) <= numel(), "view ", shape_str(shape),
           " at offset ", offset, " exceeds tensor of ", numel(), " elements");
  Tensor t = *this;
  t.offset_bytes_ += size_t(offset) * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::zero_() {
  if (!defined() || numel() == 0) return;
  memset_device(device(), raw(), 0, nbytes());
}

}  // namespace zshard
