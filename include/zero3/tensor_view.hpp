// A non-owning view of a contiguous, row-major tensor: pointer, element type and shape.
//
// The engine hands these out for parameters and gradients. The memory lives on the engine's Device (host
// memory for the cpu device, device memory for cuda) and belongs to the engine; the view is valid while
// the scope that produced it is open (see engine.hpp). The shape span points into the engine's own tables
// and stays valid as long as the engine lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zero3/dtype.hpp"
#include "zero3/error.hpp"

namespace zero3 {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::span<const int64_t> shape;  // row-major; empty for a scalar
  int64_t numel = 0;

  size_t bytes() const { return static_cast<size_t>(numel) * dtype_size(dtype); }

  // The data as T*. T must have the element's size: float for f32, uint16_t for bf16 and f16 (convert
  // with zero3::bf16_to_f32 / f16_to_f32). Throws InvalidArgument otherwise.
  template <typename T>
  T* as() const {
    if (sizeof(T) != dtype_size(dtype)) {
      throw InvalidArgument("TensorView::as: the view holds " + std::string(dtype_name(dtype)) + " elements of " +
                            std::to_string(dtype_size(dtype)) + " bytes, not " + std::to_string(sizeof(T)) +
                            "-byte elements");
    }
    return static_cast<T*>(data);
  }
};

}  // namespace zero3
