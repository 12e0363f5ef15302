// libtorch_cifar10_train: the CIFAR-10 classifier of DeepSpeed's cifar10_deepspeed.py (cifar10_net.hpp), trained
// with zero3 on the data set's binary files (cifar10_binary.hpp). The DeepSpeed config decides the ZeRO stage, the
// batch sizes, the optimizer and its schedule. Started once per rank:
//
//   zero3 launch -n 2 -- build/bin/libtorch_cifar10_train --data data/cifar-10-batches-bin --epochs 5
//
// Every optimizer step takes train_batch_size images of a shuffled order (the same order on every rank: each rank
// takes its own micro-batches of it), so the global batch and the loss do not depend on the number of ranks. After
// each epoch the ranks classify the test batch between them and print its accuracy.
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zero3/libtorch.hpp>
#include <zero3/zero3.hpp>

#include "cifar10_binary.hpp"
#include "cifar10_net.hpp"

namespace {

struct Options {
  std::string deepspeed = LIBTORCH_CIFAR10_DIR "/ds_config.json";
  std::string data = "data/cifar-10-batches-bin";
  int64_t epochs = 30;
  int64_t log_every = 0;  // 0: the config's steps_per_print
  int64_t eval_batch = 1000;
  int threads = 0;  // 0: the machine's cores shared by this machine's ranks
  uint64_t seed = 1138;
};

const char* kUsage =
    "usage: libtorch_cifar10_train [flags]   (started once per rank: zero3 launch -n N -- libtorch_cifar10_train ...)\n"
    "  --data DIR          the binary version's directory: data_batch_1.bin ... data_batch_5.bin, test_batch.bin\n"
    "                      (default data/cifar-10-batches-bin)\n"
    "  --deepspeed FILE    DeepSpeed config (default: the example's ds_config.json)\n"
    "  --epochs N          passes over the training files (30)\n"
    "  --log-every N       print the loss every N optimizer steps (default: the config's steps_per_print)\n"
    "  --eval-batch N      test images per rank and forward (1000)\n"
    "  --threads N         intra-op threads per rank (default: the cores over this machine's ranks)\n"
    "  --seed N            initial weights and shuffling, the same on every rank (1138)\n";

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data") {
      o.data = value(i);
    } else if (a == "--deepspeed") {
      o.deepspeed = value(i);
    } else if (a == "--epochs") {
      o.epochs = std::stoll(value(i));
    } else if (a == "--log-every") {
      o.log_every = std::stoll(value(i));
    } else if (a == "--eval-batch") {
      o.eval_batch = std::stoll(value(i));
    } else if (a == "--threads") {
      o.threads = std::stoi(value(i));
    } else if (a == "--seed") {
      o.seed = std::stoull(value(i));
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown flag " + a + "\n" + kUsage);
    }
  }
  if (o.epochs < 1) throw std::invalid_argument("--epochs must be at least 1");
  if (o.eval_batch < 1) throw std::invalid_argument("--eval-batch must be at least 1");
  if (o.log_every < 0) throw std::invalid_argument("--log-every must be at least 0");
  return o;
}

// Correct answers and images classified on the whole test set, counted by all ranks together. Every rank runs the
// same number of forwards (the engine's evaluation compares the ranks' unit calls): rank r classifies the r-th
// slice of each round of world x eval_batch images, and a rank left without images in the last round classifies
// image 0 and does not count it.
std::pair<int64_t, int64_t> evaluate(zero3::libtorch::ShardedModel& sharded, Cifar10Net& model, const Cifar10Set& test,
                                     int64_t eval_batch) {
  zero3::Engine& engine = sharded.engine();
  model->eval();
  float counts[2] = {0, 0};  // correct, classified
  {
    zero3::EvalMode eval = sharded.evaluate();
    torch::NoGradGuard no_grad;
    const int64_t round = eval_batch * engine.world_size();
    for (int64_t first = 0; first < test.size(); first += round) {
      int64_t begin = first + engine.rank() * eval_batch;
      int64_t end = std::min(begin + eval_batch, test.size());
      const bool counted = begin < end;
      if (!counted) {
        begin = 0;
        end = 1;
      }
      const at::Tensor logits = zero3::libtorch::call(model, cifar10_normalize(test.pixels.slice(0, begin, end)));
      if (counted) {
        counts[0] += static_cast<float>(logits.argmax(1).eq(test.labels.slice(0, begin, end)).sum().item<int64_t>());
        counts[1] += static_cast<float>(end - begin);
      }
      eval.next_batch();
    }
  }
  engine.all_reduce_host(counts, 2, zero3::ReduceOp::sum);  // exact: whole numbers below 2^24
  model->train();
  return {static_cast<int64_t>(counts[0]), static_cast<int64_t>(counts[1])};
}

int run(const Options& o) {
  zero3::Session session = zero3::initialize(o.deepspeed);
  zero3::Engine& engine = *session.engine;
  const bool rank0 = engine.rank() == 0;
  const int64_t world = engine.world_size();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(o.threads > 0 ? o.threads : std::max(1, cores / session.launch.local_world_size));

  // The config's batch triple, resolved for this world size (DeepSpeed's rule): train_batch_size images per
  // optimizer step, train_micro_batch_size_per_gpu per rank and micro-step.
  const int64_t global_batch = session.config.train_batch_size.value();
  const int64_t micro = session.config.train_micro_batch_size_per_gpu.value();
  const int64_t gas = engine.gradient_accumulation_steps();
  const int64_t log_every = o.log_every > 0 ? o.log_every : std::max<int64_t>(1, session.config.steps_per_print);

  const Cifar10Set train = read_cifar10(cifar10_files(o.data, true));
  const Cifar10Set test = read_cifar10(cifar10_files(o.data, false));
  const int64_t steps_per_epoch = train.size() / global_batch;
  if (steps_per_epoch == 0) {
    throw std::runtime_error(std::to_string(train.size()) + " training images in " + o.data +
                             " are fewer than one global batch (train_batch_size " + std::to_string(global_batch) +
                             ")");
  }

  torch::manual_seed(o.seed);  // the same initial weights on every rank
  Cifar10Net model;
  zero3::libtorch::ShardedModel sharded(engine, model.ptr(), {.units = Cifar10NetImpl::unit_paths()});
  sharded.materialize();  // each rank keeps its share; the module's own tensors are freed
  if (rank0) {
    int64_t params = 0;
    for (const std::string& u : sharded.unit_names()) params += engine.unit(*engine.find_unit(u)).numel;
    const at::Tensor means = train.pixels.to(at::kFloat).mean({0, 2, 3}) / 255.0;
    std::printf("CIFAR-10 net: %lld parameters in %zu units, ZeRO stage %d on %lld rank%s\n",
                static_cast<long long>(params), sharded.unit_names().size(), engine.stage(),
                static_cast<long long>(world), world > 1 ? "s" : "");
    std::printf("data: %lld training images (channel means %.3f %.3f %.3f), %lld test images, from %s\n",
                static_cast<long long>(train.size()), means[0].item<double>(), means[1].item<double>(),
                means[2].item<double>(), static_cast<long long>(test.size()), o.data.c_str());
    std::printf(
        "global batch %lld = %lld per rank x %lld micro-steps x %lld ranks; %lld steps per epoch (%lld "
        "images left out of each)\n",
        static_cast<long long>(global_batch), static_cast<long long>(micro), static_cast<long long>(gas),
        static_cast<long long>(world), static_cast<long long>(steps_per_epoch),
        static_cast<long long>(train.size() - steps_per_epoch * global_batch));
  }

  std::vector<int64_t> order(static_cast<size_t>(train.size()));
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), int64_t{0});
    std::mt19937_64 shuffle_rng(o.seed * 1000003 + static_cast<uint64_t>(epoch));  // the same order on every rank
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    const at::Tensor shuffled = torch::from_blob(order.data(), {train.size()}, torch::kLong);

    const auto started = std::chrono::steady_clock::now();
    double epoch_loss = 0, interval_loss = 0;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      float step_loss = 0;
      zero3::StepResult result;
      for (int64_t k = 0; k < gas; ++k) {
        const int64_t first = step * global_batch + (k * world + engine.rank()) * micro;
        const at::Tensor index = shuffled.slice(0, first, first + micro);
        const at::Tensor logits = zero3::libtorch::call(model, cifar10_normalize(train.pixels.index_select(0, index)));
        const at::Tensor loss = torch::nn::functional::cross_entropy(logits, train.labels.index_select(0, index));
        sharded.backward(loss);
        result = sharded.step();
        step_loss += loss.item<float>() / static_cast<float>(gas);
      }
      engine.all_reduce_host(&step_loss, 1, zero3::ReduceOp::avg);  // the global batch's mean loss
      epoch_loss += step_loss;
      interval_loss += step_loss;
      if ((step + 1) % log_every == 0) {
        if (rank0) {
          std::printf("epoch %lld  step %6lld  loss %.7f  lr %.3e  grad norm %.4f\n", static_cast<long long>(epoch),
                      static_cast<long long>(result.global_step), interval_loss / static_cast<double>(log_every),
                      result.lr, result.grad_norm);
        }
        interval_loss = 0;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const auto [correct, total] = evaluate(sharded, model, test, o.eval_batch);
    if (rank0) {
      std::printf("epoch %lld  train loss %.4f  test accuracy %.2f%% (%lld/%lld)  %.0f images/s\n",
                  static_cast<long long>(epoch), epoch_loss / static_cast<double>(steps_per_epoch),
                  100.0 * static_cast<double>(correct) / static_cast<double>(total), static_cast<long long>(correct),
                  static_cast<long long>(total), static_cast<double>(steps_per_epoch * global_batch) / seconds);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_cifar10_train: %s\n", e.what());
    return 1;
  }
}
