// Tensor: a typed, shaped view into a tracked Buffer. Views share the buffer, so a unit's parameters
// can be views into one flat buffer without copies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <zshard/dtype.h>
#include <zshard/error.h>
#include <zshard/memory.h>

namespace zshard {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Device device, Category category);
  static Tensor zeros(Shape shape, DType dtype, Device device, Category category);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  // Dimension i, counted from the end when negative; one out of range throws Error.
  int64_t dim(int i) const {
    const int64_t k = i < 0 ? int64_t(shape_.size()) + i : i;
    ZS_CHECK(k >= 0 && k < int64_t(shape_.size()), "dim(", i, ") of a tensor of ", shape_.size(), " dimensions");
    return shape_[size_t(k)];
  }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_ ? buffer_->device() : Device::cpu; }
  Category category() const {
    ZS_CHECK(buffer_, "category() of an undefined tensor");
    return buffer_->category();
  }

  // An undefined tensor holds no memory: null, of any type. A frozen parameter's ParamContext::grads entry
  // is one, so that a backward op handed grads()[i].data<T>() gets the null pointer it skips.
  void* raw() const { return buffer_ ? static_cast<char*>(buffer_->data()) + offset_bytes_ : nullptr; }
  template <class T>
  T* data() const {
    if (!buffer_) return nullptr;
    ZS_CHECK(dtype_of<T>() == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ",
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // A view of `shape` starting `offset` elements into this tensor.
  Tensor view(int64_t offset, Shape shape) const;
  void zero_();  // host or device memset

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace zshard
