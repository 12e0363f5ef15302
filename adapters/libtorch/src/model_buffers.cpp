// The model's buffers (BatchNorm's running statistics): listed for the engine's checkpoints and exports,
// synchronized across the data-parallel ranks, and kept across a checkpointed unit's recomputation. On a cuda engine
// they live in device memory with the parameters; the engine reads and writes host memory, so the adapter hands it
// host copies, and copies back to the device those that a load changed.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>

#include <cmath>
#include <cstring>
#include <unordered_set>

#include "model_core.hpp"
#include "zero3/log.hpp"

namespace zero3::libtorch::detail {
namespace {

namespace st = safetensors;

std::optional<st::Dtype> safetensors_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return st::Dtype::f32;
    case at::kDouble:
      return st::Dtype::f64;
    case at::kHalf:
      return st::Dtype::f16;
    case at::kBFloat16:
      return st::Dtype::bf16;
    case at::kLong:
      return st::Dtype::i64;
    case at::kInt:
      return st::Dtype::i32;
    case at::kShort:
      return st::Dtype::i16;
    case at::kChar:
      return st::Dtype::i8;
    case at::kByte:
      return st::Dtype::u8;
    case at::kBool:
      return st::Dtype::boolean;
    default:
      return std::nullopt;
  }
}

// Broadcast through a sum: each 16-bit piece of rank 0's bytes is a float (exact below 2^24), every other rank adds
// zeros, so the sum is rank 0's bytes exactly, whatever their type.
size_t byte_slots(const at::Tensor& t) { return (t.nbytes() + 1) / 2; }

void pack_bytes(const at::Tensor& t, bool mine, std::vector<float>& out) {
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  const size_t n = t.nbytes();
  for (size_t i = 0; i < n; i += 2) {
    const unsigned v = bytes[i] | (i + 1 < n ? static_cast<unsigned>(bytes[i + 1]) << 8 : 0u);
    out.push_back(mine ? static_cast<float>(v) : 0.0f);
  }
}

void unpack_bytes(const float* in, at::Tensor& t) {
  auto* bytes = static_cast<unsigned char*>(t.data_ptr());
  const size_t n = t.nbytes();
  for (size_t i = 0; i < n; i += 2) {
    const auto v = static_cast<unsigned>(std::lround(in[i / 2]));
    bytes[i] = static_cast<unsigned char>(v & 0xff);
    if (i + 1 < n) bytes[i + 1] = static_cast<unsigned char>(v >> 8);
  }
}

}  // namespace

std::vector<NamedBuffer> model_buffers(const torch::nn::Module& model) {
  std::vector<NamedBuffer> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
    out.push_back({item.key(), t});
  }
  return out;
}

void register_buffers(ModelCore& core) {
  for (const NamedBuffer& b : model_buffers(*core.model)) {
    const std::string what = "zero3::libtorch::ShardedModel: buffer '" + b.name + "'";
    if (b.tensor.device() != core.device) {
      throw InvalidArgument(what + " is on " + b.tensor.device().str() + ", the engine's device is " +
                            core.engine.device().name() + " (" + core.device.str() +
                            "): move the model with model->to() before wrapping");
    }
    if (b.tensor.layout() != at::kStrided || !b.tensor.is_contiguous()) {
      throw InvalidArgument(what + " is not a contiguous dense tensor (register a contiguous one)");
    }
    if (!safetensors_dtype(b.tensor.scalar_type())) {
      throw InvalidArgument(what + " is " + std::string(c10::toString(b.tensor.scalar_type())) +
                            ", which checkpoints cannot hold (real, integer and bool buffers only)");
    }
  }
  // Listed afresh at every save, load and export (a module may replace a buffer's tensor); empty once the
  // ShardedModel is gone.
  std::weak_ptr<ModelCore> weak = core.weak_from_this();
  core.engine.set_buffer_source([weak]() {
    std::vector<ModelBuffer> out;
    std::shared_ptr<ModelCore> c = weak.lock();
    if (!c) return out;
    for (const NamedBuffer& b : model_buffers(*c->model)) {
      const std::optional<st::Dtype> dtype = safetensors_dtype(b.tensor.scalar_type());
      if (!dtype || !b.tensor.is_contiguous() || b.tensor.device() != c->device) {
        throw InvalidArgument("zero3::libtorch: buffer '" + b.name +
                              "' was replaced after wrapping by a tensor that is not a contiguous " + c->device.str() +
                              " tensor of a real or integer type");
      }
      void* data = b.tensor.data_ptr();
      if (!b.tensor.is_cpu()) {
        at::Tensor host = b.tensor.to(at::kCPU).contiguous();
        c->handed_buffers.push_back({b.tensor, host, host.clone()});
        data = host.data_ptr();
      }
      out.push_back({b.name, *dtype, b.tensor.sizes().vec(), data});
    }
    return out;
  });
}

void apply_loaded_buffers(ModelCore& core) {
  if (core.handed_buffers.empty()) return;
  std::vector<ModelCore::HandedBuffer> handed;
  handed.swap(core.handed_buffers);
  at::NoGradGuard no_grad;
  for (const ModelCore::HandedBuffer& h : handed) {
    if (!h.host.equal(h.handed)) h.buffer.copy_(h.host);
  }
}

void sync_buffers(ModelCore& core, BufferSync mode) {
  apply_loaded_buffers(core);
  Engine& engine = core.engine;
  if (engine.world_size() == 1) return;
  std::vector<NamedBuffer> buffers = model_buffers(*core.model);
  if (buffers.empty()) return;
  // The values travel through host memory: a cuda engine's buffers are copied out and back.
  std::vector<at::Tensor> hosts;
  for (const NamedBuffer& b : buffers) hosts.push_back(b.tensor.is_cpu() ? b.tensor : b.tensor.to(at::kCPU));
  const bool rank0 = engine.rank() == 0;
  auto averaged = [mode](const at::Tensor& t) {
    return mode == BufferSync::average && at::isFloatingType(t.scalar_type());
  };
  std::vector<float> packed;
  for (const at::Tensor& host : hosts) {
    if (averaged(host)) {
      const at::Tensor f = host.to(at::kFloat).contiguous();
      packed.insert(packed.end(), f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
    } else {
      pack_bytes(host, rank0, packed);
    }
  }
  engine.all_reduce_host(packed.data(), packed.size(), ReduceOp::sum);
  at::NoGradGuard no_grad;
  const float* next = packed.data();
  const float inv_world = 1.0f / static_cast<float>(engine.world_size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    at::Tensor& host = hosts[i];
    if (averaged(host)) {
      const int64_t n = host.numel();
      at::Tensor sum = at::from_blob(const_cast<float*>(next), {n}, at::TensorOptions().dtype(at::kFloat));
      host.copy_((sum * inv_world).view(host.sizes()));
      next += n;
    } else {
      unpack_bytes(next, host);
      next += byte_slots(host);
    }
    if (!buffers[i].tensor.is_cpu()) buffers[i].tensor.copy_(host);
  }
}

KeptBuffers::KeptBuffers(torch::nn::Module& module) {
  for (const at::Tensor& b : module.buffers(/*recurse=*/true)) {
    if (b.defined()) kept_.emplace_back(b, b.clone());
  }
}

KeptBuffers::~KeptBuffers() {
  at::NoGradGuard no_grad;
  try {
    for (auto& [buffer, value] : kept_) buffer.copy_(value);
  } catch (const std::exception& e) {
    log::error("zero3::libtorch: restoring a checkpointed unit's buffers after its recomputation failed: ", e.what());
  }
}

}  // namespace zero3::libtorch::detail
