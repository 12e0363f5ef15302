// A host buffer aligned for O_DIRECT: the staging buffers of the NVMe swapper and of `zero3 iobench`.
#pragma once

#include <cstddef>
#include <span>

namespace zero3::io {

// Owns `size` bytes (rounded up to a multiple of `alignment`) at an address aligned to `alignment` (a power
// of two, at least 4096 for O_DIRECT). Zero-filled at allocation so that padding written to disk is
// deterministic. Move-only; throws InvalidArgument for a bad alignment and IoError (naming the size) when
// memory is exhausted.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size, size_t alignment = 4096);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }  // the rounded size
  size_t alignment() const { return alignment_; }
  std::span<std::byte> span() { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 0;
};

// Rounds `n` up to a multiple of `alignment` (a power of two).
constexpr size_t align_up(size_t n, size_t alignment) { return (n + alignment - 1) & ~(alignment - 1); }

}  // namespace zero3::io
