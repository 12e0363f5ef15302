#include "pipeline/stage_buffers.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace zero3::pipeline {

StageBuffers::StageBuffers(Device& device, DType dtype, const std::vector<PipelineStageInfo>& stages)
    : device_(device), dtype_(dtype), stages_(stages) {}

StageBuffers::~StageBuffers() {
  release_sent();
  for (auto& slot : slots_) {
    for (auto& [key, b] : slot) free(b);
    slot.clear();
  }
}

const PipelineStageInfo& StageBuffers::info(int stage) const {
  for (const PipelineStageInfo& s : stages_) {
    if (s.stage == stage) return s;
  }
  throw InvalidArgument(log::concat("pipeline buffers: stage ", stage, " is not held by this rank"));
}

StageBuffers::Buffer StageBuffers::allocate(int64_t numel) {
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype_);
  Buffer b{device_.allocate(bytes), numel};
  device_.fill_zero(b.data, bytes, device_.default_stream());
  bytes_ += static_cast<int64_t>(bytes);
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  return b;
}

void StageBuffers::free(Buffer b) {
  if (b.data == nullptr) return;
  const size_t bytes = static_cast<size_t>(b.numel) * dtype_size(dtype_);
  if (device_.type() == DeviceType::cpu) {
    device_.deallocate(b.data, bytes);
  } else {
    device_.deallocate_after(b.data, bytes, device_.default_stream());
  }
  bytes_ -= static_cast<int64_t>(bytes);
}

TensorView StageBuffers::view(const Buffer& b) const {
  TensorView v;
  v.data = b.data;
  v.dtype = dtype_;
  v.numel = b.numel;
  return v;
}

TensorView StageBuffers::make(Slot slot, int stage, int micro_batch, int64_t numel) {
  Buffer& b = slots_[slot][{stage, micro_batch}];
  ZERO3_REQUIRE(b.data == nullptr, InvalidArgument, "pipeline buffers: stage ", stage, ", micro-batch ", micro_batch,
                " already holds this buffer (the schedule runs a forward or backward twice)");
  b = allocate(numel);
  return view(b);
}

const StageBuffers::Buffer& StageBuffers::find(Slot slot, int stage, int micro_batch, const char* what) const {
  auto it = slots_[slot].find({stage, micro_batch});
  ZERO3_REQUIRE(it != slots_[slot].end(), InvalidArgument, "pipeline buffers: stage ", stage, ", micro-batch ",
                micro_batch, " has no ", what, " (the schedule uses it before it exists)");
  return it->second;
}

StageBuffers::Buffer StageBuffers::take(Slot slot, int stage, int micro_batch, const char* what) {
  Buffer b = find(slot, stage, micro_batch, what);
  slots_[slot].erase({stage, micro_batch});
  return b;
}

TensorView StageBuffers::make_received_input(int stage, int micro_batch) {
  return make(kInput, stage, micro_batch, info(stage).input_numel);
}

TensorView StageBuffers::input(int stage, int micro_batch, bool previous_here) {
  auto it = slots_[kInput].find({stage, micro_batch});
  if (it == slots_[kInput].end() && previous_here) {
    slots_[kInput][{stage, micro_batch}] = take(kOutput, stage - 1, micro_batch, "output of the previous stage");
  }
  return view(find(kInput, stage, micro_batch, "input activation"));
}

TensorView StageBuffers::make_output(int stage, int micro_batch) {
  return make(kOutput, stage, micro_batch, info(stage).output_numel);
}

TensorView StageBuffers::output(int stage, int micro_batch) const {
  return view(find(kOutput, stage, micro_batch, "output activation"));
}

void StageBuffers::sent_output(int stage, int micro_batch) {
  sent_.push_back(take(kOutput, stage, micro_batch, "output activation"));
}

void StageBuffers::release_input(int stage, int micro_batch) {
  auto it = slots_[kInput].find({stage, micro_batch});
  if (it == slots_[kInput].end()) return;
  free(it->second);
  slots_[kInput].erase(it);
}

TensorView StageBuffers::make_received_grad_output(int stage, int micro_batch) {
  return make(kGradOutput, stage, micro_batch, info(stage).output_numel);
}

TensorView StageBuffers::grad_output(int stage, int micro_batch, bool next_here) {
  auto it = slots_[kGradOutput].find({stage, micro_batch});
  if (it == slots_[kGradOutput].end() && next_here) {
    slots_[kGradOutput][{stage, micro_batch}] = take(kGradInput, stage + 1, micro_batch, "input gradient of the next stage");
  }
  return view(find(kGradOutput, stage, micro_batch, "gradient of the output"));
}

TensorView StageBuffers::make_grad_input(int stage, int micro_batch) {
  return make(kGradInput, stage, micro_batch, info(stage).input_numel);
}

TensorView StageBuffers::grad_input(int stage, int micro_batch) const {
  return view(find(kGradInput, stage, micro_batch, "input gradient"));
}

void StageBuffers::sent_grad_input(int stage, int micro_batch) {
  sent_.push_back(take(kGradInput, stage, micro_batch, "input gradient"));
}

void StageBuffers::release_after_backward(int stage, int micro_batch) {
  for (Slot slot : {kInput, kGradOutput}) {
    auto it = slots_[slot].find({stage, micro_batch});
    if (it == slots_[slot].end()) continue;
    free(it->second);
    slots_[slot].erase(it);
  }
}

void StageBuffers::release_sent() {
  for (Buffer& b : sent_) free(b);
  sent_.clear();
}

}  // namespace zero3::pipeline
