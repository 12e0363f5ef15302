#include "train_options.hpp"

#include <algorithm>
#include <charconv>
#include <functional>
#include <sstream>

#include "zero3/error.hpp"

namespace llama3 {
namespace {

enum class Kind { text, integer, number, flag };

struct Flag {
  const char* name;  // without the leading "--"
  Kind kind;
  const char* metavar;  // for the help text
  const char* help;
  std::function<void(TrainOptions&, const std::string&)> set;  // flags: value is "1" or "0"
};

int64_t to_int(const std::string& flag, const std::string& v, int64_t min) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < min) {
    throw zero3::InvalidArgument("--" + flag + ": got '" + v + "', expected an integer >= " + std::to_string(min));
  }
  return x;
}

double to_double(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !(x >= 0)) {
    throw zero3::InvalidArgument("--" + flag + ": got '" + v + "', expected a number >= 0");
  }
  return x;
}

std::string one_of(const std::string& flag, const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a) return v;
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : "|") + std::string(a);
  throw zero3::InvalidArgument("--" + flag + ": got '" + v + "', expected " + list);
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"model", Kind::text, "FILE", "Hugging Face config.json of the model (default configs/models/llama-3-tiny.json)",
       [](TrainOptions& o, const std::string& v) { o.model = v; }},
      {"deepspeed", Kind::text, "FILE", "DeepSpeed config JSON (default configs/zero-stage3.json)",
       [](TrainOptions& o, const std::string& v) { o.deepspeed = v; }},
      {"data", Kind::text, "PATH",
       "text file, directory of text files, or token file (*.bin, *.u32: uint32 ids or llm.c's format); "
       "repeatable (default /usr/share/common-licenses)",
       [](TrainOptions& o, const std::string& v) { o.data.push_back(v); }},
      {"eval-data", Kind::text, "PATH",
       "held-out data in the forms --data takes; repeatable. Evaluated after the last step and every --eval-interval "
       "steps: the mean loss over its every target and the perplexity",
       [](TrainOptions& o, const std::string& v) { o.eval_data.push_back(v); }},
      {"eval-interval", Kind::integer, "N", "optimizer steps between evaluations (default 0: after the last step only)",
       [](TrainOptions& o, const std::string& v) { o.eval_interval = to_int("eval-interval", v, 0); }},
      {"eval-batches", Kind::integer, "N",
       "micro-batches per rank per evaluation (default 0: every sequence of --eval-data once)",
       [](TrainOptions& o, const std::string& v) { o.eval_batches = to_int("eval-batches", v, 0); }},
      {"tokenizer", Kind::text, "bytes|FILE", "bytes (byte-level, vocab 256) or Llama-3's tokenizer.model (tiktoken)",
       [](TrainOptions& o, const std::string& v) { o.tokenizer = v; }},
      {"seq-len", Kind::integer, "N", "tokens per sequence (default 256)",
       [](TrainOptions& o, const std::string& v) { o.seq_len = to_int("seq-len", v, 1); }},
      {"micro-batch", Kind::integer, "N", "sequences per rank per micro-step (resolves train_micro_batch_size_per_gpu)",
       [](TrainOptions& o, const std::string& v) { o.micro_batch = to_int("micro-batch", v, 1); }},
      {"grad-accum", Kind::integer, "N", "micro-steps per optimizer step (resolves gradient_accumulation_steps)",
       [](TrainOptions& o, const std::string& v) { o.grad_accum = to_int("grad-accum", v, 1); }},
      {"steps", Kind::integer, "N",
       "optimizer steps (default 100; 0: no training, the starting weights evaluated on --eval-data if given)",
       [](TrainOptions& o, const std::string& v) { o.steps = to_int("steps", v, 0); }},
      {"lr", Kind::number, "X",
       "peak learning rate (resolves optimizer.params.lr; replaces an explicit one with a warning)",
       [](TrainOptions& o, const std::string& v) { o.lr = to_double("lr", v); }},
      {"warmup-steps", Kind::integer, "N",
       "linear warmup steps; without a scheduler in the config: warmup then linear decay to 0 (Hugging Face's "
       "default schedule)",
       [](TrainOptions& o, const std::string& v) { o.warmup_steps = to_int("warmup-steps", v, 0); }},
      {"precision", Kind::text, "bf16|fp16|fp32",
       "compute precision (default: the config's). CPU: bf16/fp16 parameter copies, fp32 master and fp32 arithmetic",
       [](TrainOptions& o, const std::string& v) {
         o.precision = one_of("precision", v, {"bf16", "fp16", "fp32"});
       }},
      {"device", Kind::text, "cpu|cuda|auto",
       "where the model runs (default auto: the config's zero3.device, else cpu; cuda: local rank i on GPU i, NCCL)",
       [](TrainOptions& o, const std::string& v) {
         o.device = one_of("device", v, {"cpu", "cuda", "auto"});
       }},
      {"grad-checkpointing", Kind::flag, "", "activation checkpointing per layer (default on; --no-grad-checkpointing)",
       [](TrainOptions& o, const std::string& v) { o.grad_checkpointing = v == "1"; }},
      {"pipeline-stages", Kind::integer, "N",
       "pipeline stages (replaces the config's pipeline.stages): the layers cut into N stages, the ranks into N x "
       "ranks/N data-parallel ranks; schedule, virtual stages and stage order from the config's zero3.pipeline_* keys",
       [](TrainOptions& o, const std::string& v) { o.pipeline_stages = to_int("pipeline-stages", v, 1); }},
      {"pipeline-boundary-dtype", Kind::text, "compute|activation|bf16|fp16|fp32",
       "dtype of the activations and gradients between pipeline stages (default compute: the config's compute dtype, "
       "as DeepSpeed's pipeline sends a bf16 model's activations; activation: the backend's, fp32 on cpu, which makes "
       "a pipelined cpu run equal to the unpipelined one up to round-off)",
       [](TrainOptions& o, const std::string& v) {
         o.pipeline_boundary_dtype =
             one_of("pipeline-boundary-dtype", v, {"compute", "activation", "bf16", "fp16", "fp32"});
       }},
      {"network", Kind::text, "auto|efa|socket", "inter-node transport for NCCL (efa fails without EFA)",
       [](TrainOptions& o, const std::string& v) {
         o.network = one_of("network", v, {"auto", "efa", "socket"});
       }},
      {"save-dir", Kind::text, "DIR", "checkpoint directory (a checkpoint at the end and every --save-interval steps)",
       [](TrainOptions& o, const std::string& v) { o.save_dir = v; }},
      {"save-interval", Kind::integer, "N", "optimizer steps between checkpoints (default 0: only at the end)",
       [](TrainOptions& o, const std::string& v) { o.save_interval = to_int("save-interval", v, 0); }},
      {"resume", Kind::text, "latest|TAG", "resume from a checkpoint in --save-dir",
       [](TrainOptions& o, const std::string& v) { o.resume = v; }},
      {"init-from", Kind::text, "PATH", "start from Hugging Face safetensors (file, directory or index)",
       [](TrainOptions& o, const std::string& v) { o.init_from = v; }},
      {"init-from-strict", Kind::flag, "",
       "refuse --init-from weights holding tensors that are no parameter of the model (default: name them in a "
       "warning)",
       [](TrainOptions& o, const std::string& v) { o.init_from_strict = v == "1"; }},
      {"metrics", Kind::text, "FILE",
       "per-step metrics CSV (default <save-dir>/metrics.csv, else ./llama3_train_metrics.csv; 'none' disables)",
       [](TrainOptions& o, const std::string& v) { o.metrics = v; }},
      {"seed", Kind::integer, "N", "data order seed (default 1234)",
       [](TrainOptions& o, const std::string& v) { o.seed = static_cast<uint64_t>(to_int("seed", v, 0)); }},
      {"dry-run", Kind::flag, "", "print the memory plan per GPU and per node, allocate nothing, and exit",
       [](TrainOptions& o, const std::string& v) { o.dry_run = v == "1"; }},
      {"world-size", Kind::integer, "N", "dry run: number of ranks (default: the launcher's)",
       [](TrainOptions& o, const std::string& v) { o.world_size = to_int("world-size", v, 1); }},
      {"ranks-per-node", Kind::integer, "N", "dry run: ranks per node (default: the launcher's local world size)",
       [](TrainOptions& o, const std::string& v) { o.ranks_per_node = to_int("ranks-per-node", v, 1); }},
      {"consolidate-to", Kind::text, "DIR",
       "after training, write the final weights as Hugging Face safetensors and config.json (its dtype theirs)",
       [](TrainOptions& o, const std::string& v) { o.consolidate_to = v; }},
      {"consolidate-dtype", Kind::text, "bf16|fp32", "dtype of --consolidate-to (default: bf16 when training in bf16)",
       [](TrainOptions& o, const std::string& v) {
         o.consolidate_dtype = one_of("consolidate-dtype", v, {"bf16", "fp32"});
       }},
      {"consolidate-max-shard", Kind::text, "SIZE", "largest safetensors shard, e.g. 5GB (default 5GB)",
       [](TrainOptions& o, const std::string& v) { o.consolidate_max_shard = v; }},
      {"help", Kind::flag, "", "this text", [](TrainOptions& o, const std::string& v) { o.help = v == "1"; }},
      {"version", Kind::flag, "", "print the version",
       [](TrainOptions& o, const std::string& v) { o.version = v == "1"; }},
  };
  return table;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& name) {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const Flag& f : flags()) {
    size_t d = edit_distance(name, f.name);
    if (d < best_d) best_d = d, best = f.name;
  }
  return best.empty() ? "" : " (did you mean --" + best + "?)";
}

}  // namespace

TrainOptions parse_train_options(int argc, char** argv) {
  TrainOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw zero3::InvalidArgument("argument '" + arg + "': expected a flag --name (see --help)");
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    bool negated = false;
    const Flag* flag = nullptr;
    for (const Flag& f : flags())
      if (name == f.name) flag = &f;
    if (flag == nullptr && name.rfind("no-", 0) == 0) {
      for (const Flag& f : flags())
        if (f.kind == Kind::flag && name.substr(3) == f.name) flag = &f, negated = true;
    }
    if (flag == nullptr) throw zero3::InvalidArgument("unknown flag --" + name + suggestion(name));
    if (flag->kind == Kind::flag) {
      if (has_value) {
        if (negated || (value != "true" && value != "false" && value != "1" && value != "0")) {
          throw zero3::InvalidArgument("--" + name + ": got '" + value + "', expected no value (or true/false)");
        }
        flag->set(o, value == "true" || value == "1" ? "1" : "0");
      } else {
        flag->set(o, negated ? "0" : "1");
      }
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) throw zero3::InvalidArgument("--" + name + ": expected a value " + flag->metavar);
      value = argv[++i];
    }
    flag->set(o, value);
  }
  return o;
}

std::string train_usage() {
  std::ostringstream os;
  os << "usage: llama3_train [flags]\n"
        "Trains a Llama-3 model with zero3 (ZeRO stages 0-3 from a DeepSpeed config). Run it under a launcher for\n"
        "several ranks: zero3 launch -n 2 -- llama3_train ..., torchrun --no-python, mpirun, srun, a Kubeflow "
        "TrainJob.\n\nflags:\n";
  for (const Flag& f : flags()) {
    std::string head = std::string("  --") + f.name;
    if (f.kind != Kind::flag) head += std::string(" ") + f.metavar;
    os << head;
    if (head.size() < 32) {
      os << std::string(32 - head.size(), ' ');
    } else {
      os << "\n" << std::string(32, ' ');
    }
    // The help text wrapped at 112 columns, continuation lines under the first.
    std::istringstream words(f.help);
    std::string word;
    size_t col = 32;
    bool first = true;
    while (words >> word) {
      if (!first && col + 1 + word.size() > 112) {
        os << "\n" << std::string(32, ' ');
        col = 32;
        first = true;
      }
      if (!first) os << ' ', ++col;
      os << word;
      col += word.size();
      first = false;
    }
    os << "\n";
  }
  os << "\nThreads: unless set, OMP_NUM_THREADS = cores / ranks on the node, OMP_WAIT_POLICY = passive and\n"
        "OPENBLAS_NUM_THREADS = 1 (the program re-executes itself once so the OpenMP runtime reads them).\n";
  return os.str();
}

}  // namespace llama3
