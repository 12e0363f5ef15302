// The activations and gradients a pipeline rank holds during one schedule run, per (stage, micro-batch), in the
// engine's device memory:
//   input        the activation the stage received (or, from the previous stage on this rank, that stage's output);
//                kept until the micro-batch's backward on the stage (its forward and backward see the same memory)
//   output       what the stage's forward wrote for the next stage; freed once sent (or handed over as the next
//                stage's input on this rank)
//   grad_output  the gradient of the output, received (or handed over from the next stage on this rank); freed
//                after the backward
//   grad_input   what the backward wrote for the previous stage; freed once sent (or handed over)
// A buffer handed to a send is freed once its transfer completed: at once on the cpu device, after the stream
// passes it on cuda. Whatever is left when the run fails is freed by the destructor.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "zero3/device.hpp"
#include "zero3/pipeline_engine.hpp"
#include "zero3/tensor_view.hpp"

namespace zero3::pipeline {

class StageBuffers {
 public:
  StageBuffers(Device& device, DType dtype, const std::vector<PipelineStageInfo>& stages);
  ~StageBuffers();
  StageBuffers(const StageBuffers&) = delete;
  StageBuffers& operator=(const StageBuffers&) = delete;

  // Forward side.
  TensorView make_received_input(int stage, int micro_batch);  // a buffer to receive the stage's input into
  // The stage's input: received, or (previous_here) the previous stage's output on this rank, taken over.
  TensorView input(int stage, int micro_batch, bool previous_here);
  TensorView make_output(int stage, int micro_batch);
  TensorView output(int stage, int micro_batch) const;
  void sent_output(int stage, int micro_batch);      // handed to a send: freed by release_sent()
  void release_input(int stage, int micro_batch);  // evaluation: the input is no longer needed after the forward

  // Backward side.
  TensorView make_received_grad_output(int stage, int micro_batch);
  // The gradient of the stage's output: received, or (next_here) the next stage's grad_input on this rank.
  TensorView grad_output(int stage, int micro_batch, bool next_here);
  TensorView make_grad_input(int stage, int micro_batch);
  TensorView grad_input(int stage, int micro_batch) const;
  void sent_grad_input(int stage, int micro_batch);
  void release_after_backward(int stage, int micro_batch);  // the input and the gradient of the output

  // Frees the buffers of completed sends (on cuda: once the compute stream passes them).
  void release_sent();
  // Bytes held now and at most during the run.
  int64_t bytes() const { return bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  struct Buffer {
    void* data = nullptr;
    int64_t numel = 0;
  };
  using Key = std::pair<int, int>;  // (stage, micro-batch)
  enum Slot { kInput, kOutput, kGradOutput, kGradInput, kSlots };

  const PipelineStageInfo& info(int stage) const;
  Buffer allocate(int64_t numel);
  void free(Buffer b);
  TensorView view(const Buffer& b) const;
  TensorView make(Slot slot, int stage, int micro_batch, int64_t numel);
  const Buffer& find(Slot slot, int stage, int micro_batch, const char* what) const;
  Buffer take(Slot slot, int stage, int micro_batch, const char* what);

  Device& device_;
  DType dtype_;
  std::vector<PipelineStageInfo> stages_;
  std::map<Key, Buffer> slots_[kSlots];
  std::vector<Buffer> sent_;
  int64_t bytes_ = 0;
  int64_t peak_bytes_ = 0;
};

}  // namespace zero3::pipeline
