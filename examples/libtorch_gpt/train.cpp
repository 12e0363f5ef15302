// libtorch_gpt_train: a GPT written with torch::nn (gpt.hpp), trained on bytes of text with zero3: the DeepSpeed
// config decides the ZeRO stage, the optimizer and its schedule; every rank holds 1/N of the parameters,
// gradients and Adam state. Started once per rank:
//
//   zero3 launch -n 2 -- build/bin/libtorch_gpt_train --steps 200
//
// Each step: every rank takes its own micro-batches, the model's forward runs through zero3::libtorch::call
// (the units gather their parameters), ShardedModel::backward runs autograd (the units gather again and
// reduce-scatter their gradients), and ShardedModel::step runs zero3's optimizer at the accumulation boundary.
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <zero3/libtorch.hpp>
#include <zero3/zero3.hpp>

#include "gpt.hpp"

namespace {

struct Options {
  std::string deepspeed = LIBTORCH_GPT_DIR "/ds_config.json";
  std::vector<std::string> data;
  int64_t steps = 200;
  int64_t seq = 64;
  int64_t micro_batch = 8;
  GptConfig model;
  bool checkpoint_activations = false;
  int64_t log_every = 10;
  int64_t sample = 200;  // bytes generated at the end
  std::string save;      // checkpoint directory
  std::string export_dir;
  uint64_t seed = 1234;
};

const char* kUsage =
    "usage: libtorch_gpt_train [flags]   (started once per rank: zero3 launch -n N -- libtorch_gpt_train ...)\n"
    "  --deepspeed FILE        DeepSpeed config (default: the example's ds_config.json)\n"
    "  --data PATH             text file or directory, repeatable (default /usr/share/common-licenses)\n"
    "  --steps N               optimizer steps (200)\n"
    "  --seq N                 bytes per sequence (64)\n"
    "  --micro-batch N         sequences per rank and micro-step (8)\n"
    "  --layers N --dim N --heads N   model size (4, 128, 4)\n"
    "  --checkpoint-activations       recompute each block in backward\n"
    "  --log-every N           print every N steps (10)\n"
    "  --sample N              bytes to generate at the end (200; 0: none)\n"
    "  --save DIR              save a checkpoint at the end (resumes from DIR/latest when it exists)\n"
    "  --export DIR            write the weights as Hugging Face safetensors, by the module's parameter names\n";

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--deepspeed") o.deepspeed = value(i);
    else if (a == "--data") o.data.push_back(value(i));
    else if (a == "--steps") o.steps = std::stoll(value(i));
    else if (a == "--seq") o.seq = std::stoll(value(i));
    else if (a == "--micro-batch") o.micro_batch = std::stoll(value(i));
    else if (a == "--layers") o.model.layers = std::stoll(value(i));
    else if (a == "--dim") o.model.dim = std::stoll(value(i));
    else if (a == "--heads") o.model.heads = std::stoll(value(i));
    else if (a == "--checkpoint-activations") o.checkpoint_activations = true;
    else if (a == "--log-every") o.log_every = std::max<int64_t>(1, std::stoll(value(i)));
    else if (a == "--sample") o.sample = std::stoll(value(i));
    else if (a == "--save") o.save = value(i);
    else if (a == "--export") o.export_dir = value(i);
    else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown flag " + a + "\n" + kUsage);
    }
  }
  if (o.data.empty()) o.data.push_back("/usr/share/common-licenses");
  if (o.model.dim % o.model.heads != 0) throw std::invalid_argument("--dim must be a multiple of --heads");
  o.model.block_size = o.seq;
  return o;
}

// Every byte of the files under `paths`, in a fixed order (the same on every rank).
std::string read_corpus(const std::vector<std::string>& paths) {
  std::vector<std::filesystem::path> files;
  for (const std::string& p : paths) {
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + f.string());
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

// Sequences of seq + 1 bytes from text[begin, end), at offsets drawn from (step, micro-step, rank).
at::Tensor batch(const std::string& text, size_t begin, size_t end, int64_t seq, int64_t count, uint64_t key) {
  at::Tensor ids = torch::empty({count, seq + 1}, torch::kLong);
  auto a = ids.accessor<int64_t, 2>();
  const size_t span = end - begin - static_cast<size_t>(seq) - 1;
  for (int64_t b = 0; b < count; ++b) {
    uint64_t h = (key * 64 + static_cast<uint64_t>(b) + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    const size_t at = begin + static_cast<size_t>(h % span);
    for (int64_t t = 0; t <= seq; ++t) a[b][t] = static_cast<unsigned char>(text[at + static_cast<size_t>(t)]);
  }
  return ids;
}

at::Tensor loss_of(Gpt& model, const at::Tensor& ids, int64_t seq) {
  at::Tensor logits = zero3::libtorch::call(model, ids.slice(1, 0, seq));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              ids.slice(1, 1, seq + 1).reshape({-1}));
}

int run(const Options& o) {
  zero3::InitOptions init;
  init.resolve.hidden_size = o.model.dim;  // the config's "auto" bucket sizes, as Hugging Face resolves them
  init.resolve.micro_batch = o.micro_batch;
  zero3::Session session = zero3::initialize(o.deepspeed, init);
  zero3::Engine& engine = *session.engine;
  const bool rank0 = engine.rank() == 0;
  // The ranks of this machine share its cores.
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  torch::set_num_threads(static_cast<int>(std::max<int64_t>(1, cores / session.launch.local_world_size)));

  const std::string text = read_corpus(o.data);
  const size_t split = text.size() - std::max<size_t>(text.size() / 20, static_cast<size_t>(o.seq) + 2);
  if (split < static_cast<size_t>(o.seq) * 4) throw std::runtime_error("the data is too small for --seq");

  torch::manual_seed(o.seed);  // the same initial weights on every rank
  Gpt model(o.model);
  zero3::libtorch::WrapOptions wrap;
  wrap.units = model->unit_paths();
  if (o.checkpoint_activations) {
    for (const std::string& u : wrap.units) {
      if (u.rfind("blocks.", 0) == 0) wrap.checkpoint.push_back(u);
    }
  }
  zero3::libtorch::ShardedModel sharded(engine, model.ptr(), wrap);
  sharded.materialize();  // each rank keeps its slice; the module's own tensors are freed
  if (rank0) {
    int64_t params = 0;
    for (const std::string& u : sharded.unit_names()) params += engine.unit(*engine.find_unit(u)).numel;
    std::printf("GPT: %lld parameters in %zu units, %zu bytes of text, ZeRO stage %d on %d ranks\n",
                static_cast<long long>(params), sharded.unit_names().size(), text.size(), engine.stage(),
                engine.world_size());
  }
  if (!o.save.empty() && zero3::checkpoint_exists(o.save)) {
    const zero3::LoadedCheckpoint resumed = zero3::load_checkpoint(engine, o.save);
    if (rank0) std::printf("resumed %s at step %lld\n", resumed.tag.c_str(), static_cast<long long>(engine.global_steps()));
  }

  const int64_t gas = engine.gradient_accumulation_steps();
  auto started = std::chrono::steady_clock::now();
  while (engine.global_steps() < o.steps) {
    float loss_sum = 0;
    zero3::StepResult result;
    for (int64_t k = 0; k < gas; ++k) {
      const uint64_t key = static_cast<uint64_t>((engine.micro_steps() * engine.world_size() + engine.rank()));
      at::Tensor loss = loss_of(model, batch(text, 0, split, o.seq, o.micro_batch, key), o.seq);
      sharded.backward(loss);
      result = sharded.step();
      loss_sum += loss.item<float>();
    }
    engine.all_reduce_host(&loss_sum, 1, zero3::ReduceOp::avg);
    if (rank0 && (result.global_step % o.log_every == 0 || result.global_step == o.steps)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double tokens = static_cast<double>(o.log_every * gas * o.micro_batch * o.seq * engine.world_size());
      std::printf("step %5lld  loss %.4f  lr %.2e  grad norm %.3f  %.0f tokens/s\n",
                  static_cast<long long>(result.global_step), loss_sum / static_cast<float>(gas), result.lr,
                  result.grad_norm, tokens / seconds);
      started = std::chrono::steady_clock::now();
    }
  }

  {  // Held-out loss, and a sample, without gradients: every rank runs the same forwards.
    zero3::EvalMode eval = sharded.evaluate();
    float eval_loss = 0;
    const int64_t batches = 4;
    for (int64_t b = 0; b < batches; ++b) {
      const uint64_t key = static_cast<uint64_t>(b * engine.world_size() + engine.rank());
      eval_loss += loss_of(model, batch(text, split, text.size(), o.seq, o.micro_batch, key), o.seq).item<float>();
      eval.next_batch();
    }
    eval_loss /= static_cast<float>(batches);
    engine.all_reduce_host(&eval_loss, 1, zero3::ReduceOp::avg);
    std::string sample = text.substr(split, static_cast<size_t>(o.seq / 2));
    const std::string prompt = sample;
    for (int64_t i = 0; i < o.sample; ++i) {  // greedy: the same bytes on every rank
      at::Tensor ids = torch::empty({1, std::min<int64_t>(o.seq, static_cast<int64_t>(sample.size()))}, torch::kLong);
      for (int64_t t = 0; t < ids.size(1); ++t) {
        ids[0][t] = static_cast<unsigned char>(sample[sample.size() - static_cast<size_t>(ids.size(1) - t)]);
      }
      at::Tensor logits = zero3::libtorch::call(model, ids);
      sample.push_back(static_cast<char>(logits[0][-1].argmax().item<int64_t>()));
      eval.next_batch();
    }
    if (rank0) {
      std::printf("held-out loss %.4f\n", eval_loss);
      if (o.sample > 0) std::printf("sample:\n%s|%s\n", prompt.c_str(), sample.substr(prompt.size()).c_str());
    }
  }

  if (!o.save.empty()) {
    const zero3::SavedCheckpoint saved =
        zero3::save_checkpoint(engine, o.save, "step" + std::to_string(engine.global_steps()));
    if (rank0) std::printf("checkpoint %s (%llu bytes)\n", saved.path.c_str(), static_cast<unsigned long long>(saved.bytes));
  }
  if (!o.export_dir.empty()) {
    const zero3::ExportedModel exported = zero3::save_16bit_model(engine, o.export_dir, sharded.export_options());
    if (rank0) std::printf("%s\n", exported.summary().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_gpt_train: %s\n", e.what());
    return 1;
  }
}
