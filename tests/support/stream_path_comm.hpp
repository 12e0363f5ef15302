// The communicator of StreamPathDevice tests: reports "nccl" (the engine requires it on a cuda device) and runs
// each collective on a real host communicator (gloo or local). As NCCL does, a collective is queued on its
// stream (nullptr: the compute stream) and runs when the device runs that stream up to it: after the work
// queued before it, before the work queued after it, and not before something waits for it (its Work, an
// event recorded after it, a synchronize). A missing wait between a collective and the work that reads or
// writes its buffers on another stream therefore shows up as wrong numbers or a counted free of memory in use.
// Every rank runs the same program, so every rank runs its collectives in the same order.
// It counts the collectives issued on streams other than the compute stream, those given memory that is not
// the device's (NCCL reads and writes device memory only: host memory there is an illegal access or a refusal),
// and those given stream nullptr while the device computes on a caller's stream: NCCL runs them on CUDA's legacy
// default stream, unordered with the caller's stream (the device's legacy_stream() queue here).
// split() splits the inner communicator; the parts count into their parent's counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>

#include "support/stream_path_device.hpp"
#include "zero3/comm.hpp"

namespace zero3::testing {

class StreamPathComm final : public Communicator {
 public:
  // `device` must outlive this communicator.
  StreamPathComm(std::shared_ptr<Communicator> inner, StreamPathDevice& device);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) override;
  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream stream) override;
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override;
  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream) override;
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override;

  int64_t side_stream_gathers() const { return counts_->side_stream_gathers.load(); }
  int64_t side_stream_reductions() const { return counts_->side_stream_reductions.load(); }
  int64_t host_memory_collectives() const { return counts_->host_memory_collectives.load(); }
  int64_t legacy_stream_collectives() const { return counts_->legacy_stream_collectives.load(); }
  // The streams collectives were queued on (the gather and reduce streams, and the engine's collective check).
  std::set<Stream> collective_streams() const;

 private:
  struct Counts {
    std::atomic<int64_t> side_stream_gathers{0};
    std::atomic<int64_t> side_stream_reductions{0};
    std::atomic<int64_t> host_memory_collectives{0};
    std::atomic<int64_t> legacy_stream_collectives{0};
  };
  StreamPathComm(std::shared_ptr<Communicator> inner, StreamPathDevice& device, std::shared_ptr<Counts> counts);

  std::shared_ptr<Communicator> inner_;
  StreamPathDevice& device_;
  std::shared_ptr<Counts> counts_;
  mutable std::mutex mu_;
  std::set<Stream> collective_streams_;

  void note_buffers(const void* a, const void* b);
  void note_stream(Stream stream);
  // The queue a collective given `stream` runs on.
  Stream stream_of(Stream stream);
};

}  // namespace zero3::testing
