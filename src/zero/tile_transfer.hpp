// The device<->host traffic of the optimizer step when the optimizer state lives in host memory on a GPU
// (offload_optimizer cpu or nvme): the reduced gradients go down tile by tile, the CPU Adam runs on each
// tile, and the tile's updated compute-dtype parameters go back up.
//
//   d2h stream:  [grads 0] [grads 1]          [grads 2]          ...
//   host:                  [Adam 0  ]         [Adam 1  ]         [Adam 2 ] ...
//   h2d stream:                       [copy 0]           [copy 1]          ...
//
// Two pinned slots for gradients and two for compute copies: the gradients of tile i+1 come down and the
// parameters of tile i-1 go up while the host runs Adam on tile i. The copy streams wait for the compute
// stream at begin() (the reduced gradients are in place, earlier readers of the compute copies are done),
// and the compute stream waits for both copy streams at end(); the host waits only for the events of the
// slots it is about to use.
//
// Usage per step: begin(); fetch(tile 0); then for each tile i: fetch(tile i+1) if any, take(), Adam into
// copy_staging() (or into host memory of the caller's own), send(); finally end(). At most two tiles are
// fetched and not yet taken.
//
// Threads: the engine's training thread only.
#pragma once

#include <cstdint>
#include <memory>

#include "device/device_kernels.hpp"
#include "zero/device_buffer.hpp"
#include "zero/host_buffer.hpp"
#include "zero3/device.hpp"
#include "zero3/dtype.hpp"

namespace zero3::detail {

class TileTransfer {
 public:
  // grad_dtype: the gradient accumulator's dtype; copy_elem_bytes: bytes per element of the largest compute
  // dtype sent back (0: nothing is sent back; no h2d stream or copy slots); tile_numel: the largest tile.
  // host_kernels: kernels over host memory (the cpu device's), for the fp32 conversion of the gradients.
  // Staging is counted in `host_counters` as buffers.
  TileTransfer(Device& device, DeviceKernels& host_kernels, MemoryCounters& host_counters, DType grad_dtype,
               size_t copy_elem_bytes, int64_t tile_numel);
  ~TileTransfer();  // waits for the copy streams
  TileTransfer(const TileTransfer&) = delete;
  TileTransfer& operator=(const TileTransfer&) = delete;

  void begin();
  // Queues the copy of n gradient elements at `grads` (device memory, grad dtype) into the next slot.
  void fetch(const void* grads, int64_t n);
  // Blocks until the oldest fetched tile is in host memory; returns its n gradients in fp32 multiplied by
  // `scale` (in its pinned slot, or in an fp32 scratch tile for a 16-bit accumulator). Valid until the next
  // fetch(): the tile after the one already fetched lands in this tile's slot.
  float* take(float scale);
  // Pinned memory for the compute copy of the tile just taken, free of earlier copies (blocks until the
  // copy that last used it has finished).
  void* copy_staging();
  // Queues the copy of `bytes` of copy_staging() to `dst` (device memory).
  void send(void* dst, size_t bytes);
  // The compute stream's later work waits for every copy queued so far. Safe to call after a failure
  // mid-step: untaken tiles simply land in their slots.
  void end();

  int64_t tile_numel() const { return tile_numel_; }

 private:
  Device& device_;
  DeviceKernels& host_kernels_;
  DType grad_dtype_;
  size_t copy_elem_bytes_;
  int64_t tile_numel_;
  Stream compute_;
  std::unique_ptr<DeviceStream> d2h_;
  std::unique_ptr<DeviceStream> h2d_;   // null when nothing is sent back
  std::unique_ptr<DeviceEvent> ready_;  // compute stream at begin()
  std::unique_ptr<DeviceEvent> fetched_event_[2];
  std::unique_ptr<DeviceEvent> sent_event_[2];
  bool sent_recorded_[2] = {false, false};
  std::unique_ptr<DeviceEvent> d2h_done_;
  std::unique_ptr<DeviceEvent> h2d_done_;
  int64_t fetch_n_[2] = {0, 0};
  int64_t fetched_ = 0;  // tiles fetched this step
  int64_t taken_ = 0;    // tiles taken this step
  HostBuffer grad_slot_[2];
  HostBuffer copy_slot_[2];
  HostBuffer grad_f32_;  // 16-bit accumulator: the taken tile in fp32
};

}  // namespace zero3::detail
