#include "comm/nccl/nccl_watchdog.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "comm/nccl/nccl_check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::comm {
namespace {

std::chrono::milliseconds pick_interval(std::chrono::milliseconds timeout) {
  auto tenth = timeout / 10;
  return std::clamp(tenth, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
}

std::string seconds(std::chrono::milliseconds ms) {
  std::string s = std::to_string(ms.count() / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

NcclWatchdog::NcclWatchdog(std::shared_ptr<NcclCommState> state)
    : state_(std::move(state)), interval_(pick_interval(state_->timeout)) {
  thread_ = std::thread([this] { run(); });
}

NcclWatchdog::~NcclWatchdog() { stop(); }

void NcclWatchdog::add_locked(std::shared_ptr<NcclWork> work) {
  std::lock_guard<std::mutex> lock(list_mu_);
  pending_.push_back(std::move(work));
}

void NcclWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(list_mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::shared_ptr<NcclWork>> NcclWatchdog::take_pending() {
  std::lock_guard<std::mutex> lock(list_mu_);
  std::vector<std::shared_ptr<NcclWork>> out(pending_.begin(), pending_.end());
  pending_.clear();
  return out;
}

void NcclWatchdog::abort_locked(const std::string& reason) {
  if (state_->aborted) return;
  state_->aborted = true;
  state_->abort_reason = reason;
  // Fail first, abort second: the abort ends the kernels and so fires the events behind them, and a Work
  // must not read that as success.
  for (auto& w : take_pending()) {
    if (w->poll() == NcclWork::State::running) {
      w->fail(std::make_exception_ptr(
          CommError(w->description() + " did not complete: the communicator was aborted because " + reason)));
    }
  }
  log::error(state_->name, " aborted: ", reason);
  if (state_->comm) {
    ncclResult_t r = ncclCommAbort(state_->comm);
    if (r != ncclSuccess) log::error("ncclCommAbort on ", state_->name, ": ", ncclGetErrorString(r));
    state_->comm = nullptr;
  }
}

void NcclWatchdog::run() {
  // The events it polls belong to the communicator's device: make it current on this thread, or the first
  // CUDA call here would initialise a context on device 0.
  if (cudaError_t e = cudaSetDevice(state_->device); e != cudaSuccess) {
    log::error("watchdog of ", state_->name, ": cudaSetDevice(", state_->device, "): ", cudaGetErrorString(e));
  }
  std::unique_lock<std::mutex> lock(list_mu_);
  while (!stop_) {
    cv_.wait_for(lock, interval_, [&] { return stop_; });
    if (stop_) break;
    lock.unlock();
    try {
      check_once();
    } catch (const std::exception& e) {
      // A watchdog that dies silently is worse than one that logs: keep watching.
      log::error("watchdog of ", state_->name, ": ", e.what());
    }
    lock.lock();
  }
}

void NcclWatchdog::check_once() {
  std::vector<std::shared_ptr<NcclWork>> snapshot;
  {
    std::lock_guard<std::mutex> lock(list_mu_);
    snapshot.assign(pending_.begin(), pending_.end());
  }
  std::shared_ptr<NcclWork> oldest_running;
  std::vector<NcclWork*> finished;
  for (auto& w : snapshot) {
    if (w->poll() == NcclWork::State::running) {
      if (!oldest_running) oldest_running = w;
    } else {
      finished.push_back(w.get());
    }
  }
  if (!finished.empty()) {
    std::lock_guard<std::mutex> lock(list_mu_);
    std::erase_if(pending_, [&](const std::shared_ptr<NcclWork>& w) {
      return std::find(finished.begin(), finished.end(), w.get()) != finished.end();
    });
  }

  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->aborted || !state_->comm) return;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(state_->comm, &async);
  if (r != ncclSuccess) async = r;
  if (async != ncclSuccess && async != ncclInProgress) {
    std::string reason = "NCCL reported an asynchronous error on " + state_->name + ": " +
                         detail::nccl_error_detail(async, state_->comm);
    if (oldest_running) reason += " (the oldest unfinished collective: " + oldest_running->description() + ")";
    if (oldest_running) oldest_running->fail(std::make_exception_ptr(CommError(reason)));
    abort_locked(reason);
    return;
  }
  // Polled again under the lock: the collective may have finished since the snapshot, at the deadline.
  if (oldest_running && std::chrono::steady_clock::now() - oldest_running->issued() > state_->timeout &&
      oldest_running->poll() == NcclWork::State::running) {
    std::string reason = oldest_running->description() + " did not complete within " + seconds(state_->timeout) +
                         " s on " + state_->name +
                         ": another rank did not reach it, died, or is stuck (it has to be called in the same "
                         "order on every rank)";
    const char* last = ncclGetLastError(state_->comm);
    if (last && *last) reason += "; NCCL's last error: " + std::string(last);
    oldest_running->fail(std::make_exception_ptr(TimeoutError(reason)));
    abort_locked(reason);
  }
}

}  // namespace zero3::comm
