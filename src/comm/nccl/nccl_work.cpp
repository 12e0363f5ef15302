#include "comm/nccl/nccl_work.hpp"

#include "device/cuda/cuda_check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::comm {
namespace {

// How long wait() sleeps between event polls: short next to a collective, long next to a CPU spin.
constexpr auto kPollInterval = std::chrono::microseconds(50);

}  // namespace

NcclWork::NcclWork(std::string description, cudaEvent_t event) : description_(std::move(description)), event_(event) {}

NcclWork::~NcclWork() {
  if (event_) {
    cudaError_t e = cudaEventDestroy(event_);
    // At process exit the runtime may already be gone; the event went with it.
    if (e != cudaSuccess && e != cudaErrorCudartUnloading) {
      log::warn("destroying the event of ", description_, ": ", cudaGetErrorString(e));
      cudaGetLastError();
    }
  }
}

bool NcclWork::settle_locked() {
  if (done_) return true;
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // not an error, but the runtime records it as the last one
    return false;
  }
  if (e != cudaSuccess) {
    error_ = std::make_exception_ptr(
        CudaError(description_ + ": cudaEventQuery on its completion event failed: " + detail::cuda_error_detail(e)));
  }
  done_ = true;
  cv_.notify_all();
  return true;
}

NcclWork::State NcclWork::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!settle_locked()) return State::running;
  return error_ ? State::failed : State::done;
}

void NcclWork::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

void NcclWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  // No deadline here: the communicator's watchdog fails the Work when its timeout passes.
  while (!settle_locked()) cv_.wait_for(lock, kPollInterval);
  if (error_) std::rethrow_exception(error_);
}

bool NcclWork::wait_for(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (!settle_locked()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    cv_.wait_for(lock, kPollInterval);
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool NcclWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return settle_locked();
}

}  // namespace zero3::comm
