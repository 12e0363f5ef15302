#include "zero/tile_transfer.hpp"

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {

TileTransfer::TileTransfer(Device& device, DeviceKernels& host_kernels, MemoryCounters& host_counters, DType grad_dtype,
                           size_t copy_elem_bytes, int64_t tile_numel)
    : device_(device),
      host_kernels_(host_kernels),
      grad_dtype_(grad_dtype),
      copy_elem_bytes_(copy_elem_bytes),
      tile_numel_(tile_numel),
      compute_(device.default_stream()) {
  const auto n = static_cast<size_t>(tile_numel);
  d2h_ = device.make_stream();
  ready_ = device.make_event();
  d2h_done_ = device.make_event();
  for (int s = 0; s < 2; ++s) {
    fetched_event_[s] = device.make_event();
    grad_slot_[s] =
        HostBuffer(device, HostMemory::pinned, host_counters, MemoryCategory::buffers, n * dtype_size(grad_dtype));
  }
  if (grad_dtype != DType::f32) {
    grad_f32_ = HostBuffer(device, HostMemory::pageable, host_counters, MemoryCategory::buffers, n * sizeof(float));
  }
  if (copy_elem_bytes > 0) {
    h2d_ = device.make_stream();
    h2d_done_ = device.make_event();
    for (int s = 0; s < 2; ++s) {
      sent_event_[s] = device.make_event();
      copy_slot_[s] =
          HostBuffer(device, HostMemory::pinned, host_counters, MemoryCategory::buffers, n * copy_elem_bytes);
    }
  }
}

TileTransfer::~TileTransfer() {
  try {
    d2h_->synchronize();
    if (h2d_) h2d_->synchronize();
  } catch (const std::exception& e) {
    log::warn("optimizer step transfers: ", e.what());
  }
}

void TileTransfer::begin() {
  fetched_ = 0;
  taken_ = 0;
  ready_->record(compute_);
  ready_->wait_on(d2h_->get());
  if (h2d_) ready_->wait_on(h2d_->get());
}

void TileTransfer::fetch(const void* grads, int64_t n) {
  ZERO3_REQUIRE(n >= 1 && n <= tile_numel_ && fetched_ < taken_ + 2, Error, "optimizer step transfers: tile ", fetched_,
                " of ", n, " elements cannot be fetched now (tile size ", tile_numel_, ", ", fetched_ - taken_,
                " tiles waiting)");
  const int s = static_cast<int>(fetched_ % 2);
  device_.copy(grad_slot_[s].data(), grads, static_cast<size_t>(n) * dtype_size(grad_dtype_), d2h_->get());
  fetched_event_[s]->record(d2h_->get());
  fetch_n_[s] = n;
  ++fetched_;
}

float* TileTransfer::take(float scale) {
  ZERO3_REQUIRE(taken_ < fetched_, Error, "optimizer step transfers: no fetched tile to take");
  const int s = static_cast<int>(taken_ % 2);
  ++taken_;
  fetched_event_[s]->synchronize();
  const int64_t n = fetch_n_[s];
  if (grad_dtype_ == DType::f32) {
    auto* g = grad_slot_[s].as<float>();
    if (scale != 1.0f) host_kernels_.scale_copy(g, DType::f32, g, DType::f32, scale, n);
    return g;
  }
  host_kernels_.scale_copy(grad_f32_.data(), DType::f32, grad_slot_[s].data(), grad_dtype_, scale, n);
  return grad_f32_.as<float>();
}

void* TileTransfer::copy_staging() {
  ZERO3_REQUIRE(h2d_ != nullptr && taken_ >= 1, Error,
                "optimizer step transfers: no copy staging (nothing is sent back, or no tile was taken)");
  const int s = static_cast<int>((taken_ - 1) % 2);
  if (sent_recorded_[s]) sent_event_[s]->synchronize();
  return copy_slot_[s].data();
}

void TileTransfer::send(void* dst, size_t bytes) {
  const int s = static_cast<int>((taken_ - 1) % 2);
  ZERO3_REQUIRE(h2d_ != nullptr && bytes <= copy_slot_[s].bytes(), Error, "optimizer step transfers: ", bytes,
                " bytes do not fit the copy staging of ", copy_slot_[s].bytes(), " bytes");
  device_.copy(dst, copy_slot_[s].data(), bytes, h2d_->get());
  sent_event_[s]->record(h2d_->get());
  sent_recorded_[s] = true;
}

void TileTransfer::end() {
  d2h_done_->record(d2h_->get());
  d2h_done_->wait_on(compute_);
  if (h2d_) {
    h2d_done_->record(h2d_->get());
    h2d_done_->wait_on(compute_);
  }
}

}  // namespace zero3::detail
