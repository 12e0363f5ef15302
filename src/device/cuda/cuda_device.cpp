#include "device/cuda/cuda_device.hpp"

#include <cstdint>
#include <cstdlib>

#include "device/cuda/cuda_check.hpp"
#include "device/cuda/cuda_device_guard.hpp"
#include "device/cuda/cuda_kernels.hpp"
#include "device/cuda/cuda_stream.hpp"
#include "device/cuda/pinned_host.hpp"
#include "device/device_registry.hpp"
#include "zero3/build_config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::detail {
namespace {

cudaStream_t as_cuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

class CudaDeviceStream final : public DeviceStream {
 public:
  explicit CudaDeviceStream(int device) : stream_(device) {}
  Stream get() const override { return stream_.stream(); }
  void synchronize() override { stream_.synchronize(); }

 private:
  CudaStream stream_;
};

// nullptr is the device's compute stream here too.
class CudaDeviceEvent final : public DeviceEvent {
 public:
  CudaDeviceEvent(int device, cudaStream_t compute) : event_(device), compute_(compute) {}
  void record(Stream stream) override { event_.record(stream != nullptr ? as_cuda(stream) : compute_); }
  void wait_on(Stream stream) override { event_.make_wait(stream != nullptr ? as_cuda(stream) : compute_); }
  void synchronize() override { event_.synchronize(); }
  bool done() override { return event_.done(); }

 private:
  CudaEvent event_;
  cudaStream_t compute_;
};

int checked_index(int index) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw CudaError(log::concat("cuda:", index, ": no CUDA device: ", why));
  if (index < 0 || index >= count) {
    throw InvalidArgument(log::concat("cuda:", index, ": this machine has ", count, " CUDA device",
                                      count == 1 ? "" : "s", " (cuda:0",
                                      count > 1 ? log::concat("..cuda:", count - 1) : "", ")"));
  }
  return index;
}

// The stream the device computes on: the caller's, checked to be on this device, or the legacy default stream.
cudaStream_t compute_stream_for(int index, Stream given) {
  if (given == nullptr) return cudaStreamLegacy;
  cudaStream_t s = as_cuda(given);
#if CUDART_VERSION >= 12080
  int owner = -1;
  if (cudaError_t e = cudaStreamGetDevice(s, &owner); e != cudaSuccess) {
    throw InvalidArgument(log::concat("make_device(\"cuda:", index, "\", stream): CUDA does not know the stream ",
                                      static_cast<const void*>(s), " (", cuda_error_detail(e),
                                      "); pass a live cudaStream_t of this device"));
  }
  if (owner != index) {
    throw InvalidArgument(log::concat("make_device(\"cuda:", index, "\", stream): the stream belongs to cuda:", owner,
                                      "; make the device with that index, or a stream of cuda:", index));
  }
#endif
  return s;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(e);
    cudaGetLastError();
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "the CUDA runtime reports 0 devices";
  return count;
}

CudaDevice::CudaDevice(int index, Stream compute_stream)
    : index_(checked_index(index)),
      compute_(compute_stream_for(index_, compute_stream)),
      pool_(std::make_unique<DevicePool>(index_, compute_)),
      kernels_(index_, *pool_) {
  ZERO3_CUDA_CHECK(cudaGetDeviceProperties(&properties_, index_));
  CudaDeviceGuard guard(index_);
  // Creates the primary context now, so the first allocation does not pay for it (and fails here instead
  // when the device cannot be used, e.g. it is in exclusive mode and taken).
  ZERO3_CUDA_CHECK(cudaFree(nullptr));
  if (cudaError_t e = cuda::kernel_image_status(); e != cudaSuccess) {
    cudaGetLastError();
    throw CudaError(log::concat(name(), " (", properties_.name, ", compute capability ", properties_.major, ".",
                                properties_.minor, ") cannot run this build's kernels (", cuda_error_detail(e),
                                "): it was built for CUDA architectures ", ZERO3_CUDA_ARCHITECTURES,
                                "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=", properties_.major, properties_.minor));
  }
}

CudaDevice::~CudaDevice() = default;

void* CudaDevice::allocate(size_t bytes) { return pool_->allocate(bytes); }

void CudaDevice::deallocate(void* ptr, size_t bytes) noexcept { pool_->deallocate(ptr, bytes); }

void CudaDevice::deallocate_after(void* ptr, size_t bytes, Stream stream) noexcept {
  pool_->deallocate_after(ptr, bytes, stream_of(stream));
}

void* CudaDevice::allocate_host(size_t bytes) {
  // The process-wide pinned pool allocates under the current device: this one, not whichever the thread had.
  CudaDeviceGuard guard(index_);
  return pinned_host_allocate(bytes);
}

void CudaDevice::deallocate_host(void* ptr, size_t bytes) noexcept { pinned_host_deallocate(ptr, bytes); }

void CudaDevice::deallocate_host_after(void* ptr, size_t bytes, Stream stream) noexcept {
  try {
    // The event goes on `stream` of this device (the legacy default stream means the current device's).
    CudaDeviceGuard guard(index_);
    pinned_host_deallocate_after(ptr, bytes, reinterpret_cast<Stream>(stream_of(stream)));
  } catch (const std::exception& e) {
    log::error(name(), ": releasing ", bytes, " bytes of pinned host memory after stream work: ", e.what(),
               "; the block is kept");
  }
}

std::unique_ptr<DeviceStream> CudaDevice::make_stream() { return std::make_unique<CudaDeviceStream>(index_); }

std::unique_ptr<DeviceEvent> CudaDevice::make_event() { return std::make_unique<CudaDeviceEvent>(index_, compute_); }

void CudaDevice::copy(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0 || dst == src) return;
  CudaDeviceGuard guard(index_);
  const cudaStream_t s = stream_of(stream);
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  // cudaMemcpy itself may return before a device-to-device copy is done; the contract says done.
  if (stream == nullptr) ZERO3_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaDevice::move(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0 || dst == src) return;
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto p = reinterpret_cast<uintptr_t>(src);
  if ((d > p ? d - p : p - d) >= bytes) return copy(dst, src, bytes, stream);
  // cudaMemcpy is undefined for overlapping ranges: go through a block of the pool, allocated and freed on the
  // copy's own stream.
  CudaDeviceGuard guard(index_);
  const cudaStream_t s = stream_of(stream);
  void* temp = pool_->allocate(bytes, s);
  try {
    ZERO3_CUDA_CHECK(cudaMemcpyAsync(temp, src, bytes, cudaMemcpyDeviceToDevice, s));
    ZERO3_CUDA_CHECK(cudaMemcpyAsync(dst, temp, bytes, cudaMemcpyDeviceToDevice, s));
    if (stream == nullptr) ZERO3_CUDA_CHECK(cudaStreamSynchronize(s));
  } catch (...) {
    pool_->deallocate_after(temp, bytes, s);
    throw;
  }
  pool_->deallocate_after(temp, bytes, s);
}

void CudaDevice::fill_zero(void* ptr, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(index_);
  const cudaStream_t s = stream_of(stream);
  ZERO3_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, s));
  if (stream == nullptr) ZERO3_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaDevice::synchronize() {
  CudaDeviceGuard guard(index_);
  ZERO3_CUDA_CHECK(cudaDeviceSynchronize());
}

int64_t CudaDevice::bytes_in_use() const { return pool_->bytes_in_use(); }

int64_t CudaDevice::peak_bytes_in_use() const { return pool_->peak_bytes_in_use(); }

namespace {

// Makes the rank's GPU current before anything else uses CUDA: the device guards give back the device that was
// current before them, and giving back a never-chosen device 0 creates a context on it (cudaSetDevice initialises
// the device since CUDA 12), so every rank of a node would hold a context on GPU 0 (or fail, with GPUs in
// exclusive-process mode).
void activate(int index) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw CudaError(log::concat("cuda:", index, ": no CUDA device: ", why));
  if (index < 0 || index >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw InvalidArgument(log::concat("cuda:", index, ": this process sees ", count, " CUDA device",
                                      count == 1 ? "" : "s",
                                      visible ? log::concat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : std::string(),
                                      "; one rank per GPU (the launcher's local rank): start at most that many ranks "
                                      "per node, or name the GPU (cuda:N)"));
  }
  ZERO3_CUDA_CHECK(cudaSetDevice(index));
}

const DeviceRegistrar kCudaRegistrar(
    "cuda",
    [](int index, Stream compute_stream) -> std::unique_ptr<Device> {
      return std::make_unique<CudaDevice>(index, compute_stream);
    },
    [] { return cuda_device_count() > 0; }, activate);

}  // namespace
}  // namespace zero3::detail
