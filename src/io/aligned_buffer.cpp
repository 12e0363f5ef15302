#include "io/aligned_buffer.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "zero3/error.hpp"

namespace zero3::io {

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment < sizeof(void*)) {
    throw InvalidArgument("AlignedBuffer: alignment " + std::to_string(alignment) +
                          " is not a power of two of at least " + std::to_string(sizeof(void*)));
  }
  if (size == 0) return;
  size_t rounded = align_up(size, alignment);
  void* p = nullptr;
  int rc = posix_memalign(&p, alignment, rounded);
  if (rc != 0) {
    throw IoError("cannot allocate an aligned I/O buffer of " + std::to_string(rounded) + " bytes (alignment " +
                  std::to_string(alignment) + "): " + std::strerror(rc));
  }
  std::memset(p, 0, rounded);
  data_ = static_cast<std::byte*>(p);
  size_ = rounded;
  alignment_ = alignment;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      alignment_(std::exchange(other.alignment_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    alignment_ = std::exchange(other.alignment_, 0);
  }
  return *this;
}

}  // namespace zero3::io
