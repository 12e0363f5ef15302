// A libtorch program outside the zero3 tree, built against the installed package with
// find_package(zero3 COMPONENTS libtorch) and started by the installed launcher:
// `zero3 launch -n 2 -- consumer ds_config.json`. It trains a small torch::nn classifier (Linear, BatchNorm1d,
// Linear; each a unit) at ZeRO stage 3, each rank a share of the batch, and checks what a user relies on: the
// loss falls, the BatchNorm running statistics are the same on every rank after training (the adapter's buffer
// synchronization), and the gathered weights have the module's names and shapes.
#include <torch/torch.h>
#include <zero3/libtorch.hpp>
#include <zero3/zero3.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int64_t kIn = 4, kHidden = 8, kClasses = 3, kSamples = 24, kSteps = 30;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        bn(register_module("bn", torch::nn::BatchNorm1d(kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = zero3::libtorch::call(fc1, x);
    h = torch::relu(zero3::libtorch::call(bn, h));
    return zero3::libtorch::call(fc2, h);
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "libtorch consumer rank %d: FAILED: %s\n", rank, what.c_str());
  return 1;
}

int run(const std::string& config_path) {
  const int world = zero3::detect_launch().world_size;
  if (kSamples % world != 0) return fail(0, "run on a number of ranks that divides " + std::to_string(kSamples));
  const int64_t share = kSamples / world;
  zero3::InitOptions opts;
  opts.resolve.micro_batch = share;
  zero3::Session s = zero3::initialize(config_path, opts);
  const int rank = s.comm->rank();

  torch::manual_seed(3);
  Net net;
  zero3::libtorch::ShardedModel sharded(*s.engine, net.ptr(), {.units = {"fc1", "bn", "fc2"}});
  sharded.materialize();

  // Three well separated classes; each rank takes its share of the samples.
  torch::manual_seed(5);
  const at::Tensor labels = torch::arange(kSamples) % kClasses;
  const at::Tensor centers = torch::randn({kClasses, kIn}) * 2;
  const at::Tensor inputs = torch::randn({kSamples, kIn}) * 0.3 + centers.index_select(0, labels);
  const at::Tensor x = inputs.narrow(0, rank * share, share), y = labels.narrow(0, rank * share, share);
  float first = 0, last = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    at::Tensor loss = torch::nn::functional::cross_entropy(zero3::libtorch::call(net, x), y);
    sharded.backward(loss);
    sharded.step();
    float value = loss.item<float>();
    s.engine->all_reduce_host(&value, 1, zero3::ReduceOp::avg);
    if (step == 0) first = value;
    last = value;
  }
  if (!(last < 0.5f * first)) {
    return fail(rank, "the loss went from " + std::to_string(first) + " to " + std::to_string(last));
  }
  // The running statistics: every rank's equal to the largest and the smallest over the ranks.
  for (const auto& item : net->named_buffers()) {
    const at::Tensor b = item.value().to(torch::kFloat).contiguous();
    std::vector<float> high(b.data_ptr<float>(), b.data_ptr<float>() + b.numel()), low(high);
    for (float& v : low) v = -v;
    s.engine->all_reduce_host(high.data(), high.size(), zero3::ReduceOp::max);
    s.engine->all_reduce_host(low.data(), low.size(), zero3::ReduceOp::max);
    for (size_t i = 0; i < high.size(); ++i) {
      if (high[i] != -low[i]) return fail(rank, "buffer '" + item.key() + "' differs between the ranks");
    }
  }
  const auto state = sharded.gather_state_dict();
  if (state.size() != 6 || !state.contains("bn.weight") ||
      state["fc1.weight"].sizes() != at::IntArrayRef{kHidden, kIn}) {
    return fail(rank, "gather_state_dict() does not hold the module's parameters by their names");
  }
  if (rank == 0) {
    std::printf(
        "libtorch consumer (zero3 %s): %d rank(s), stage %d, %s; loss %.4f -> %.4f over %lld steps, "
        "BatchNorm statistics equal on every rank: ok\n",
        zero3::version().c_str(), world, s.engine->stage(), s.comm->backend(), first, last,
        static_cast<long long>(kSteps));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer DS_CONFIG.json (started by zero3 launch)\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch consumer: %s\n", e.what());
  }
  return 1;
}
