// What the libtorch adapter costs: the same Llama-style torch::nn model (tests/libtorch/support/tiny_llama.hpp)
// trained by plain libtorch (forward, backward, torch::optim::AdamW) and through zero3::libtorch at the given
// stages, on the same global batch. Prints milliseconds per optimizer step, the best and the median of all steps
// (on a shared machine the best is the steadier measure of the work itself), tokens per second at the best, and
// the ratios to plain libtorch. A program that prints figures, not a timed test.
//
//   zero3 launch -n 1 -- bench_libtorch_overhead              # one rank: the adapter's overhead
//   zero3 launch -n 2 -- bench_libtorch_overhead              # 2 ranks beside libtorch alone
//   bench_libtorch_overhead --smoke                           # a tiny model, two steps (the test suite runs it)
//
// Plain libtorch runs in rank 0 alone with every core of the machine (--threads) while the other ranks wait; zero3
// runs on every rank, each with its share of the cores and of the batch. The runs alternate for --rounds rounds
// so that a change in the machine's load during the run hits both alike. Flags: --dim N --layers N --seq N --batch N (global sequences per step) --steps N (per round)
// --warmup N --rounds N --stages 0,3 --threads N.
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <ATen/Context.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/engine_world.hpp"
#include "support/libtorch_training.hpp"

namespace zero3::testing {
namespace {

struct BenchOptions {
  TinyLlamaConfig model;
  int64_t batch = 8;  // global sequences per optimizer step
  int64_t steps = 4;
  int64_t warmup = 1;
  int64_t rounds = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> stages{0, 3};
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  o.model.vocab = 256;
  o.model.dim = 256;
  o.model.heads = 4;
  o.model.layers = 4;
  o.model.ffn = 688;
  o.model.seq = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::stoll(argv[++i]) : throw std::invalid_argument(a + " needs a value"); };
    if (a == "--smoke") {
      o.model = TinyLlamaConfig{};
      o.batch = 6;
      o.steps = 2;
      o.warmup = 0;
      o.rounds = 1;
    } else if (a == "--dim") {
      o.model.dim = next();
      o.model.ffn = o.model.dim * 8 / 3;
    } else if (a == "--layers") {
      o.model.layers = next();
    } else if (a == "--seq") {
      o.model.seq = next();
    } else if (a == "--batch") {
      o.batch = next();
    } else if (a == "--steps") {
      o.steps = next();
    } else if (a == "--warmup") {
      o.warmup = next();
    } else if (a == "--rounds") {
      o.rounds = next();
    } else if (a == "--threads") {
      o.threads = static_cast<int>(next());
    } else if (a == "--stages") {
      o.stages.clear();
      std::stringstream list(argv[++i]);
      for (std::string s; std::getline(list, s, ',');) o.stages.push_back(std::stoi(s));
    } else {
      throw std::invalid_argument("unknown flag " + a);
    }
  }
  return o;
}

struct Summary {
  double best = 0;
  double median = 0;
};

Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? Summary{} : Summary{v.front(), v[v.size() / 2]};
}

at::Tensor loss_of(const std::shared_ptr<torch::nn::Module>& model, const TinyLlamaConfig& c, const at::Tensor& ids) {
  at::Tensor logits = tiny_llama_logits(model, ids.slice(1, 0, c.seq));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, c.vocab}), ids.slice(1, 1, c.seq + 1).reshape({-1}));
}

// Seconds of each optimizer step after the warm-up, plain libtorch on the whole global batch in one micro-batch.
std::vector<double> time_plain(const BenchOptions& o) {
  auto model = make_tiny_llama(o.model, 1);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  TrainSpec spec;
  spec.micro_batch = o.batch;
  std::vector<double> times;
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    const at::Tensor ids = token_batch(o.model, spec, s, 0);
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    loss_of(model, o.model, ids).backward();
    opt.step();
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return times;
}

// The same through the adapter on every rank of `world` (rank 0's times).
std::vector<double> time_zero3(const BenchOptions& o, int stage, const std::shared_ptr<Communicator>& world) {
  TrainSpec spec;
  spec.world = world->size();
  spec.micro_batch = o.batch / world->size();
  Config config = libtorch_test_config(stage, spec);
  config.zero.reduce_bucket_size = 5e6;
  config.zero.prefetch_bucket_size = 5e6;
  config.zero.param_persistence_threshold = 1e4;
  Engine engine(resolved_for(config, *world), world, cpu_device());
  libtorch::ShardedModel sharded(engine, make_tiny_llama(o.model, 1),
                                 libtorch::WrapOptions{.units = tiny_llama_units(o.model)});
  sharded.materialize();
  std::vector<double> times;
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    const at::Tensor ids = token_batch(o.model, spec, s, world->rank());
    const auto t0 = std::chrono::steady_clock::now();
    sharded.backward(loss_of(sharded.module(), o.model, ids));
    sharded.step();
    if (s >= o.warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return times;
}

int run(int argc, char** argv) {
  const BenchOptions o = parse(argc, argv);
  if (std::getenv("FLUSH_DENORMAL")) at::globalContext().setFlushDenormal(true);
  auto world = engine_world();
  const int ranks = world->size();
  if (o.batch % ranks != 0) throw std::invalid_argument("--batch must be a multiple of the number of ranks");
  const int cores = o.threads;
  const double tokens = static_cast<double>(o.batch * o.model.seq);
  int64_t params = 0;
  for (const auto& p : make_tiny_llama(o.model, 1)->parameters()) params += p.numel();

  std::vector<double> plain_times;
  std::vector<std::vector<double>> stage_times(o.stages.size());
  for (int64_t round = 0; round < o.rounds; ++round) {
    if (world->rank() == 0) {
      torch::set_num_threads(cores);
      for (double t : time_plain(o)) plain_times.push_back(t);
    }
    world->barrier();
    torch::set_num_threads(std::max(1, cores / ranks));
    for (size_t i = 0; i < o.stages.size(); ++i) {
      for (double t : time_zero3(o, o.stages[i], world)) stage_times[i].push_back(t);
    }
  }
  if (world->rank() == 0) {
    const Summary plain = summarize(plain_times);
    std::printf("model: dim %lld, %lld layers, seq %lld, %lld parameters; global batch %lld sequences; %d threads\n",
                static_cast<long long>(o.model.dim), static_cast<long long>(o.model.layers),
                static_cast<long long>(o.model.seq), static_cast<long long>(params), static_cast<long long>(o.batch),
                cores);
    std::printf("%-34s %9s %9s %9s %11s %12s\n", "run (ms per optimizer step)", "best", "median", "tokens/s",
                "ratio best", "ratio median");
    auto row = [&](const std::string& name, const Summary& t) {
      std::printf("%-34s %9.1f %9.1f %9.0f %11.2f %12.2f\n", name.c_str(), t.best * 1e3, t.median * 1e3,
                  tokens / t.best, t.best / plain.best, t.median / plain.median);
    };
    row("libtorch alone, " + std::to_string(cores) + " threads", plain);
    for (size_t i = 0; i < o.stages.size(); ++i) {
      row("zero3 stage " + std::to_string(o.stages[i]) + ", " + std::to_string(ranks) + " rank" + (ranks > 1 ? "s" : "") +
              " x " + std::to_string(std::max(1, cores / ranks)) + " threads",
          summarize(stage_times[i]));
    }
  }
  return 0;
}

}  // namespace
}  // namespace zero3::testing

int main(int argc, char** argv) {
  try {
    return zero3::testing::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_libtorch_overhead: %s\n", e.what());
    return 1;
  }
}
