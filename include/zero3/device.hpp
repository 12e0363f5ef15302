// Where the engine keeps parameters, gradients and optimizer state, and runs its own element kernels.
//
// One small interface, one implementation per kind of memory: "cpu" (host memory, OpenMP kernels; always
// available) and "cuda" (device memory, streams, CUDA kernels; in builds with CUDA). The engine allocates
// everything it holds through its Device, so the Device's counters are the engine's footprint on it. Devices
// are made by make_device() / make_cpu_device(); the engine runs its element kernels on those only (an Engine
// given a Device of another origin throws InvalidArgument).
//
// Compute stream (cuda): a Device computes on one stream, default_stream(): the caller's when it was made
// with make_device(name, stream) (zero3/stream.hpp says who owns it), else CUDA's legacy default stream.
//
// Ownership: the caller creates the Device and keeps it alive for as long as any Engine uses it.
// Threads: allocate/deallocate/copy may be called from several threads at once (the engine's communication
// thread frees and copies while the training thread computes). Counters are exact at any moment.
// Errors: allocation failure throws zero3::Error (cpu) or CudaError (cuda) naming the size and what is
// already in use; nothing here calls exit or abort.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zero3/stream.hpp"

namespace zero3 {

enum class DeviceType { cpu, cuda };

// A queue of device work (cuda: a non-blocking CUDA stream, which does not wait for CUDA's legacy default
// stream). Made by Device::make_stream(); owned by the caller; destroying it lets queued work finish.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // What copy(), the kernels and the collectives take (nullptr on cpu, where all work completes in the call).
  virtual Stream get() const = 0;
  // Blocks the calling thread until the work queued so far has finished.
  virtual void synchronize() = 0;
};

// A point in a stream's work (cuda: a CUDA event), for ordering streams without blocking the host: record
// it on the producing stream, then make the consuming stream wait on it. Made by Device::make_event().
// One thread records an event at a time; wait_on/synchronize/done may be called from any thread.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Marks the work queued on `stream` so far (replacing the previous mark).
  virtual void record(Stream stream) = 0;
  // Work queued on `stream` after this call starts after the marked work; the host does not wait.
  virtual void wait_on(Stream stream) = 0;
  // Blocks the calling thread until the marked work has finished.
  virtual void synchronize() = 0;
  // Whether the marked work has finished (true for an event never recorded).
  virtual bool done() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceType type() const = 0;
  virtual int index() const = 0;         // cpu: 0
  virtual std::string name() const = 0;  // "cpu", "cuda:0"

  // `bytes` of device memory, aligned to at least 64 bytes; nullptr for 0 bytes. The contents are
  // undefined. Throws when the memory is not available. cuda: stream-ordered on default_stream() (CUDA's
  // cudaMallocAsync): ready for work queued on that stream after the call and for the calls that wait (copy
  // with nullptr); work on another stream must be ordered after that stream first (an event recorded on it
  // after the allocation), or it may still race with earlier work on that stream that used the same memory.
  virtual void* allocate(size_t bytes) = 0;
  // Returns memory from allocate(); `bytes` is the size it was allocated with. nullptr is a no-op. No
  // queued work may still use the memory (see deallocate_after).
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
  // Like deallocate, for memory that work already queued on `stream` may still use: it is handed out again
  // only after that work has finished (cuda: freed in the order of `stream`, cudaFreeAsync; on the compute
  // stream it is reused by later allocations without any wait; cpu: at once). Work queued on other streams
  // must not use it any more once `stream` gets there (order them with an event first).
  virtual void deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept;

  // Host memory the device copies to and from asynchronously (cuda: page-locked, from a cache; cpu: plain
  // 64-byte aligned memory). nullptr for 0 bytes. Not counted in bytes_in_use(). Throws when unavailable.
  virtual void* allocate_host(size_t bytes);
  virtual void deallocate_host(void* ptr, size_t bytes) noexcept;
  // Like deallocate_host, for memory that work already queued on `stream` may still use (cuda: reused after
  // an event recorded on `stream`; cpu: at once).
  virtual void deallocate_host_after(void* ptr, size_t bytes, Stream stream) noexcept;

  // The compute stream: where this device's work given nullptr runs, where allocate() orders its memory and
  // what an Engine on it computes on (cuda: the stream given to make_device, else CUDA's legacy default stream
  // cudaStreamLegacy, where kernels launched without a stream run; cpu: nullptr). Unlike nullptr, passing it
  // to copy() or fill_zero() queues the operation without waiting for it.
  virtual Stream default_stream() const { return nullptr; }

  // Streams and events (cpu: streams are nullptr and events are always done, since work completes in the
  // call that queues it).
  virtual std::unique_ptr<DeviceStream> make_stream();
  virtual std::unique_ptr<DeviceEvent> make_event();

  // Copies `bytes` between two non-overlapping ranges, each in device or host memory. On cpu it completes
  // before returning; on cuda it is ordered on `stream` (nullptr: on default_stream(), and the call returns
  // once the copy is done).
  virtual void copy(void* dst, const void* src, size_t bytes, Stream stream = nullptr) = 0;
  // Like copy, but the ranges may overlap (both in device memory).
  virtual void move(void* dst, const void* src, size_t bytes, Stream stream = nullptr) = 0;
  virtual void fill_zero(void* ptr, size_t bytes, Stream stream = nullptr) = 0;
  // Waits for all work queued on this device (cpu: returns at once).
  virtual void synchronize() = 0;

  // Bytes allocated and not yet freed, and the most there ever were. (A device may keep freed blocks for
  // reuse; they are not counted here.)
  virtual int64_t bytes_in_use() const = 0;
  virtual int64_t peak_bytes_in_use() const = 0;
};

// The host-memory device. Kernels run in OpenMP loops on the calling thread's team.
std::unique_ptr<Device> make_cpu_device();

// "cpu", "cuda", "cuda:N", or "auto" (cuda when compiled in and a device is usable, else cpu). Throws
// Unsupported for cuda in a build without it, InvalidArgument for an unknown name.
std::unique_ptr<Device> make_device(const std::string& name);
// The same device computing on the caller's `compute_stream` (zero3/stream.hpp: the caller keeps the stream
// alive until the device and every Engine on it are gone); nullptr is the plain make_device(name). Throws
// InvalidArgument when the name resolves to a device without streams (cpu) or the stream belongs to another
// GPU than the one named.
std::unique_ptr<Device> make_device(const std::string& name, Stream compute_stream);

}  // namespace zero3
