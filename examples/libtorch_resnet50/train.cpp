// libtorch_resnet50_train: ResNet-50 in torchvision's layout (resnet.hpp) trained with zero3 under the DeepSpeed
// config (ZeRO stage 2, AdamW) on synthetic ImageNet-shaped data: a few fixed batches of random 3xSxS images with
// random labels of 1000 classes, cycled, so the loss falls as the model learns them. Started once per rank:
//
//   zero3 launch -n 2 -- build/bin/libtorch_resnet50_train --steps 20
//
// --benchmark measures the same model, batch and threads trained by plain libtorch (forward, backward,
// torch::optim::AdamW with the config's hyper-parameters, rank 0 alone while the other ranks wait) and through
// zero3 (every rank, each with its share of the batch and of the threads), in alternating rounds, and prints images
// per second for both and their ratio. A program that prints figures, not a timed test.
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <zero3/libtorch.hpp>
#include <zero3/zero3.hpp>

#include "resnet.hpp"

namespace {

struct Options {
  std::string deepspeed = LIBTORCH_RESNET50_DIR "/ds_config.json";
  int64_t batch = 0;  // images per optimizer step; 0: the config's train_batch_size
  int64_t image_size = 224;
  int64_t steps = 20;
  int64_t distinct_batches = 4;
  int64_t log_every = 1;
  int threads = 0;  // 0: the machine's cores (plain libtorch) or their share (each rank)
  uint64_t seed = 1234;
  bool benchmark = false;
  int64_t rounds = 3;
  int64_t warmup = 1;
};

const char* kUsage =
    "usage: libtorch_resnet50_train [flags]   (started once per rank: zero3 launch -n N -- libtorch_resnet50_train)\n"
    "  --deepspeed FILE    DeepSpeed config (default: the example's ds_config.json, ZeRO stage 2)\n"
    "  --batch N           images per optimizer step over all ranks (default: the config's train_batch_size)\n"
    "  --image-size N      side of the square synthetic images (224; at least 32)\n"
    "  --steps N           optimizer steps (20; with --benchmark: measured steps per round, 3)\n"
    "  --distinct-batches N  synthetic batches cycled through (4)\n"
    "  --log-every N       print every N steps (1)\n"
    "  --threads N         intra-op threads: plain libtorch's, split among this machine's ranks for zero3\n"
    "                      (default: the machine's cores)\n"
    "  --seed N            initial weights and data, the same on every rank (1234)\n"
    "  --benchmark         images/s of plain libtorch and of zero3 on the same model, batch and threads\n"
    "  --rounds N --warmup N   benchmark rounds (3) and unmeasured steps at the start of each run (1)\n";

Options parse(int argc, char** argv) {
  Options o;
  bool steps_given = false;
  auto value = [&](int& i) -> int64_t {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return std::stoll(argv[++i]);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--deepspeed") {
      if (i + 1 >= argc) throw std::invalid_argument("--deepspeed needs a value");
      o.deepspeed = argv[++i];
    } else if (a == "--batch") {
      o.batch = value(i);
    } else if (a == "--image-size") {
      o.image_size = value(i);
    } else if (a == "--steps") {
      o.steps = value(i);
      steps_given = true;
    } else if (a == "--distinct-batches") {
      o.distinct_batches = value(i);
    } else if (a == "--log-every") {
      o.log_every = value(i);
    } else if (a == "--threads") {
      o.threads = static_cast<int>(value(i));
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(value(i));
    } else if (a == "--benchmark") {
      o.benchmark = true;
    } else if (a == "--rounds") {
      o.rounds = value(i);
    } else if (a == "--warmup") {
      o.warmup = value(i);
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown flag " + a + "\n" + kUsage);
    }
  }
  if (o.benchmark && !steps_given) o.steps = 3;
  if (o.image_size < 32) throw std::invalid_argument("--image-size must be at least 32 (ResNet-50 halves it 5 times)");
  if (o.batch < 0 || o.steps < 1 || o.distinct_batches < 1 || o.log_every < 1 || o.rounds < 1 || o.warmup < 0) {
    throw std::invalid_argument(
        "--batch must be at least 0, --warmup at least 0, and --steps, --distinct-batches, "
        "--log-every and --rounds at least 1");
  }
  return o;
}

// The synthetic data: `count` global batches of N(0, 1) images and labels in 0-999, the same on every rank.
struct SyntheticBatch {
  at::Tensor images;
  at::Tensor labels;
};

std::vector<SyntheticBatch> synthetic_batches(const Options& o, int64_t batch, int64_t classes) {
  std::vector<SyntheticBatch> batches;
  for (int64_t i = 0; i < o.distinct_batches; ++i) {
    at::Generator gen = at::detail::createCPUGenerator(o.seed * 7919 + static_cast<uint64_t>(i));
    batches.push_back(
        {at::randn({batch, 3, o.image_size, o.image_size}, gen), at::randint(classes, {batch}, gen, at::kLong)});
  }
  return batches;
}

at::Tensor loss_of(ResNet& model, const at::Tensor& images, const at::Tensor& labels) {
  return torch::nn::functional::cross_entropy(zero3::libtorch::call(model, images), labels);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Summary {
  double best = 0;
  double median = 0;
};

Summary summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  return seconds.empty() ? Summary{} : Summary{seconds.front(), seconds[seconds.size() / 2]};
}

// The same ResNet-50 and global batch trained by plain libtorch in this process: seconds of each step after
// the warm-up.
std::vector<double> time_plain(const Options& o, const zero3::Config& config, const std::vector<SyntheticBatch>& data) {
  torch::manual_seed(o.seed);
  ResNet model;
  const zero3::OptimizerConfig& c = config.optimizer;
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(c.lr.value())
                                                         .betas({c.beta1, c.beta2})
                                                         .eps(c.eps)
                                                         .weight_decay(c.weight_decay.value()));
  std::vector<double> times;
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    const SyntheticBatch& b = data[static_cast<size_t>(s % o.distinct_batches)];
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    loss_of(model, b.images, b.labels).backward();
    optimizer.step();
    if (s >= o.warmup) times.push_back(seconds_since(t0));
  }
  return times;
}

int run(const Options& o) {
  zero3::Config config = zero3::load_config(o.deepspeed);
  if (o.batch > 0) config.train_batch_size = o.batch;  // the rest of the triple follows DeepSpeed's rule
  zero3::Session session = zero3::initialize(std::move(config));
  zero3::Engine& engine = *session.engine;
  const bool rank0 = engine.rank() == 0;
  const int64_t world = engine.world_size();
  const int64_t global_batch = session.config.train_batch_size.value();
  const int64_t micro = session.config.train_micro_batch_size_per_gpu.value();
  const int64_t gas = engine.gradient_accumulation_steps();
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int rank_threads = std::max(1, threads / session.launch.local_world_size);
  const std::vector<SyntheticBatch> data = synthetic_batches(o, global_batch, 1000);

  torch::manual_seed(o.seed);  // the same initial weights on every rank
  ResNet model;
  int64_t params = 0;
  for (const at::Tensor& p : model->parameters()) params += p.numel();
  const size_t tensors = model->parameters().size(), buffers = model->buffers().size();
  zero3::libtorch::ShardedModel sharded(engine, model.ptr(), {.units = model->unit_paths});
  sharded.materialize();  // each rank keeps its share; the module's own tensors are freed
  if (rank0) {
    std::printf("ResNet-50: %lld parameters in %zu tensors, %zu buffers, %zu units; ZeRO stage %d on %lld rank%s\n",
                static_cast<long long>(params), tensors, buffers, sharded.unit_names().size(), engine.stage(),
                static_cast<long long>(world), world > 1 ? "s" : "");
    std::printf(
        "synthetic data: %lld distinct batches of %lld images 3x%lldx%lld; global batch %lld = %lld per rank x "
        "%lld micro-steps x %lld ranks\n",
        static_cast<long long>(o.distinct_batches), static_cast<long long>(global_batch),
        static_cast<long long>(o.image_size), static_cast<long long>(o.image_size),
        static_cast<long long>(global_batch), static_cast<long long>(micro), static_cast<long long>(gas),
        static_cast<long long>(world));
  }

  // One optimizer step through zero3 on every rank: each rank's micro-batches of the step's global batch.
  float loss_sum = 0;
  auto zero3_step = [&](int64_t step) {
    const SyntheticBatch& b = data[static_cast<size_t>(step % o.distinct_batches)];
    zero3::StepResult result;
    loss_sum = 0;
    for (int64_t k = 0; k < gas; ++k) {
      const int64_t first = (k * world + engine.rank()) * micro;
      const at::Tensor loss =
          loss_of(model, b.images.slice(0, first, first + micro), b.labels.slice(0, first, first + micro));
      sharded.backward(loss);
      result = sharded.step();
      loss_sum += loss.item<float>() / static_cast<float>(gas);
    }
    return result;
  };

  if (!o.benchmark) {
    torch::set_num_threads(rank_threads);
    auto started = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < o.steps; ++step) {
      const zero3::StepResult result = zero3_step(step);
      engine.all_reduce_host(&loss_sum, 1, zero3::ReduceOp::avg);
      if (rank0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
        std::printf("step %4lld  loss %.4f  lr %.2e  grad norm %.3f  %.2f images/s\n",
                    static_cast<long long>(result.global_step), loss_sum, result.lr, result.grad_norm,
                    static_cast<double>(o.log_every * global_batch) / seconds_since(started));
        started = std::chrono::steady_clock::now();
      }
    }
    return 0;
  }

  std::vector<double> plain_times, zero3_times;
  for (int64_t round = 0; round < o.rounds; ++round) {
    if (rank0) {
      torch::set_num_threads(threads);
      for (double t : time_plain(o, session.config, data)) plain_times.push_back(t);
    }
    float barrier = 0;
    engine.all_reduce_host(&barrier, 1, zero3::ReduceOp::sum);  // the other ranks wait for rank 0's libtorch run
    torch::set_num_threads(rank_threads);
    for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      zero3_step(round * (o.warmup + o.steps) + s);
      if (s >= o.warmup) zero3_times.push_back(seconds_since(t0));
    }
  }
  if (rank0) {
    const Summary plain = summarize(plain_times), sharded_run = summarize(zero3_times);
    const double images = static_cast<double>(global_batch);
    auto count = [](int64_t n, const std::string& what) { return std::to_string(n) + " " + what + (n > 1 ? "s" : ""); };
    auto row = [&](const std::string& name, const Summary& t) {
      std::printf("%-40s %12.2f %14.2f\n", name.c_str(), images / t.best, images / t.median);
    };
    std::printf("%-40s %12s %14s\n", ("images/s (global batch " + std::to_string(global_batch) + ")").c_str(),
                "best step", "median step");
    row("plain libtorch, 1 process x " + count(threads, "thread"), plain);
    row("zero3 stage " + std::to_string(engine.stage()) + ", " + count(world, "rank") + " x " +
            count(rank_threads, "thread"),
        sharded_run);
    std::printf("%-40s %12.2f %14.2f\n", "ratio zero3 / plain libtorch", plain.best / sharded_run.best,
                plain.median / sharded_run.median);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_resnet50_train: %s\n", e.what());
    return 1;
  }
}
