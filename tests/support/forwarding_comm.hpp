// A communicator that passes every call on to another: the base of the tests' communicators that change one thing
// (the backend they report, a collective at which the process dies) and leave the rest to a real communicator.
#pragma once

#include <memory>
#include <utility>

#include "zero3/comm.hpp"

namespace zero3::testing {

class ForwardingComm : public Communicator {
 public:
  explicit ForwardingComm(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  int cuda_device() const override { return inner_->cuda_device(); }
  bool checks_collectives() const override { return inner_->checks_collectives(); }
  WorkPtr all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) override {
    return inner_->all_gather_into(out, in, count, dtype, stream);
  }
  WorkPtr reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    return inner_->reduce_scatter(out, in, count, dtype, op, stream);
  }
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    return inner_->all_reduce(buf, count, dtype, op, stream);
  }
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    return inner_->broadcast(buf, count, dtype, root, stream);
  }
  WorkPtr all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream) override {
    return inner_->all_to_all(out, in, count, dtype, stream);
  }
  void barrier() override { inner_->barrier(); }
  WorkPtr send_recv(const std::vector<PeerTransfer>& transfers, Stream stream) override {
    return inner_->send_recv(transfers, stream);
  }
  std::unique_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }

 protected:
  std::shared_ptr<Communicator> inner_;
};

}  // namespace zero3::testing
