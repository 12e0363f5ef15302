// config_reference_markdown(): docs/config.md, written from the key table.
#include <string>

#include "config/key_table.hpp"
#include "zero3/config.hpp"

namespace zero3 {
namespace {

using config_detail::KeyEntry;
using config_detail::KeyStatus;
using config_detail::When;

constexpr const char* kIntro = R"(# Config reference

<!-- This file is the output of `zero3 config docs`, generated from the key table in
src/config/key_table.cpp; a unit test fails when they differ. Edit the table, then run
`build/bin/zero3 config docs > docs/config.md`. -->

zero3 reads DeepSpeed's JSON config (`ds_config.json`) unchanged and adds one section of its own,
`zero3`. This page lists every key zero3 knows, what DeepSpeed calls it, its default, and what zero3
does with it. Check a file, and see every value it resolves to, with

    zero3 config check ds_config.json --world-size 16 --hidden-size 4096 --micro-batch 4 --grad-accum 4 --precision bf16

It prints the resolved config as JSON on stdout and warnings on stderr, and exits non-zero with a
message naming the key path, the value and what was expected when the file cannot be used. Other
flags: `--lr X`, `--weight-decay X`, `--max-grad-norm X`, `--total-steps N`, `--warmup-steps N` (for
the optimizer and scheduler "auto" values), `--save-16bit-model true|false` (for
`stage3_gather_16bit_weights_on_model_save` "auto"), `--check-paths` (also check that NVMe directories
exist and are writable, as a run does when it starts) and `--max-config-bytes N` (the size cap below).

## Reading rules

- **Status.** *supported*: read and acted on. *alias*: another accepted name of a key (DeepSpeed
  accepts both `stage3_prefetch_bucket_size` and `prefetch_bucket_size`). *deprecated*: an old name
  or form, read as the new one with a warning. *ignored*: accepted with no effect, with a warning
  when it is set to anything but its "off" value, because ignoring it cannot change the results.
  *refused*: an error, with the reason, when it asks for something zero3 does not do (the user would
  get something other than what the file asks for); its "off" value is accepted.
- **Defaults** are DeepSpeed 0.18's (the version the seed configs ran with). DeepSpeed 0.19 changed
  two: `gradient_clipping` (1.0) and the offload sections' `pin_memory` (true). Write them out to
  get the same behaviour from both.
- **Numbers.** Integers may be written as floats when whole (`5e8`, `1e9`, `4.0`); a fraction
  (`15099494.4`) is an error naming the key. Booleans are `true` or `false` only. `null` means
  "not given".
- **Text.** `//`, `/* */` and `#` comments and trailing commas are accepted (DeepSpeed reads the
  file with hjson). A key given twice in one object is an error.
- **Unknown keys.** Inside a section: an error with a "did you mean" suggestion. At the top level:
  one warning listing them (DeepSpeed ignores them silently).
- **Two names for one setting** (an alias and its key, or a deprecated key and its replacement) in
  the same file: an error.

## Limits of the reader

No file makes the reader crash, hang or print a message the size of the input; what it cannot use is
a `ConfigError` naming the file or the key path.

- **Size.** `load_config` reads at most 16 MiB (16777216 bytes; `max_bytes` in a program,
  `--max-config-bytes N` for `zero3 config check`). A larger regular file is refused before it is
  read, naming its size and the cap; a device such as `/dev/zero` is refused once the cap is passed.
- **Pipes, FIFOs, devices.** Read without blocking, for at most 5 s in all: a writer that keeps the
  FIFO open without finishing gets an error saying so. A FIFO that no writer holds open reads as empty
  (no waiting for a writer to come). `zero3 config check <(jq . ds_config.json)` works.
- **Directories** are named as such ("is a directory"), not reported as a JSON syntax error.
- **Nesting.** Arrays and objects nest at most 256 levels, the top-level object included; deeper is
  an error naming the path (its first and last levels) and the limit.
- **Numbers** must fit in a double: `1e400` is an error naming the key ("the number 1e400 is out of
  range"). A NUL byte is an error with its line and column (JSON readers stop at it silently).
- **Messages.** A value quoted in an error is cut to 80 characters and 8 levels of nesting; a key
  name to 64 bytes, with control characters written `\u00XX`. A warning about unknown top-level keys
  names the first 10 and counts the rest. Names longer than 100 bytes get no "did you mean".
- **Arithmetic.** "auto" sizes are computed in 64-bit integers with overflow checks: a hidden size
  whose square does not fit (`--hidden-size 4294967296`) is an error naming the key, the rule and the
  hidden size, and so is a batch size (micro batch x accumulation x world size) that does not fit.

## "auto"

As in Hugging Face's DeepSpeed integration, "auto" is filled from the training program's values
(`ResolveInputs` in a program, flags of `zero3 config check`). An "auto" that nothing resolves is an
error that names the flag to pass. A program value that contradicts an explicit config value
(micro batch, gradient accumulation, precision) is an error too.

| Key | Resolves to |
|---|---|
| `train_micro_batch_size_per_gpu` | the program's micro batch (`--micro-batch`) |
| `gradient_accumulation_steps` | the program's gradient accumulation (`--grad-accum`) |
| `train_batch_size` | micro batch x gradient accumulation x world size (`--world-size`, default 1) |
| `gradient_clipping` | the program's max grad norm (`--max-grad-norm`), else 1.0 |
| `bf16.enabled`, `fp16.enabled` | whether the program's precision (`--precision`) is bf16 / fp16 |
| `zero_optimization.stage3_gather_16bit_weights_on_model_save` | the program's value (`--save-16bit-model`), else false (Accelerate's `zero3_save_16bit_model` default) |
| `zero_optimization.reduce_bucket_size` | hidden_size^2 (`--hidden-size`) |
| `zero_optimization.stage3_prefetch_bucket_size` | int(0.9 x hidden_size^2) at stage 3, else DeepSpeed's default |
| `zero_optimization.stage3_param_persistence_threshold` | 10 x hidden_size at stage 3, else DeepSpeed's default |
| `optimizer.params.lr` | the program's learning rate (`--lr`) |
| `optimizer.params.weight_decay` | the program's weight decay (`--weight-decay`), else 0 |
| `optimizer.params.betas`, `optimizer.params.eps` | the program's values, else 0.9, 0.999 and 1e-8 |
| `scheduler.params.warmup_min_lr` | 0 |
| `scheduler.params.warmup_max_lr` | the program's learning rate, else `optimizer.params.lr` |
| `scheduler.params.warmup_num_steps` | the program's warmup steps (`--warmup-steps`) |
| `scheduler.params.total_num_steps` | the program's total steps (`--total-steps`) |

**A missing precision section** is filled the way Accelerate fills it: when the program's precision is
bf16 (fp16) and the file has no `bf16` (`fp16`) section at all, the section counts as
`{"enabled": true}` (a config with only `"fp16": {"enabled": "auto"}` in a bf16 program runs bf16). A
section that is present keeps its value, so `"enabled": false` in a bf16 program, or fp16 enabled in
a bf16 program, is a mismatch error. Without a program precision a missing section is off, as in
DeepSpeed.

**Batch sizes** follow DeepSpeed's rule: `train_batch_size` = `train_micro_batch_size_per_gpu` x
`gradient_accumulation_steps` x world size. Given two, the third is inferred; given only the batch
size or only the micro batch, gradient accumulation is 1. All three must then agree exactly.

## Forms of published configs

Values that DeepSpeed, Hugging Face or Accelerate accept and that zero3 reads with the nearest meaning
(tests/data/configs/real/ has a config of each shape):

- `zero_optimization.sub_group_size: 0` (axolotl's ZeRO-3 configs): DeepSpeed then makes each
  parameter its own optimizer sub-group. zero3's optimizer tiles never span units, so 0 is read as
  9223372036854775807, one tile per unit's owned range (logged at info level); that is also what any
  size at least as large as the largest owned range gives.
- `zero_optimization.reduce_bucket_size: 0` (transformers' older test configs): DeepSpeed then reduces
  each parameter's gradient on its own. zero3's buckets then hold the largest unit (its slices on all
  ranks at stages 2-3, the unit at stages 0-1); the values reduced are the same for any bucket size.
- `stage3_gather_16bit_weights_on_model_save: "auto"` (Accelerate's templates): see the table above.
- `fp16.enabled: "auto"` with no `bf16` section in a bf16 program (FastChat's configs): bf16, as above.
- `offload_param` below stage 3 (configs generated for every stage): DeepSpeed reads it only at stage
  3. zero3 ignores it there too, with a warning naming the key, and reads its device as "none".

## Cross-key checks

- `zero_optimization.offload_param` is read at stage 3 only (above); `offload_optimizer` needs stage
  1, 2 or 3; an `offload_optimizer.ratio` below 1 needs stage 3.
- `"device": "nvme"` needs `nvme_path` (or `ZERO3_SWAP_DIR`, which replaces every `nvme_path`). When
  a run starts the directory must exist and be writable. The canonical configs
  (`configs/zero3-offload-nvme.json`) use `/tmp/zero3-nvme`: create it, or point `nvme_path` at a
  directory on a fast local NVMe disk.
- `fp16.enabled` and `bf16.enabled` cannot both be true.
- `zero3.comm_backend` "nccl" needs a CUDA device; `zero3.network` "efa" needs NCCL.

Environment variables (`ZERO3_*`) are listed by `zero3 env`; they are declared in
src/core/env_knobs.def.

## DeepSpeed's limits

zero3 runs every combination of the layout keys below as the config says. DeepSpeed (read at
microsoft/DeepSpeed of 2025-02, `deepspeed/`) refuses some of them or quietly runs something else;
`zero3 plan --advise` marks each such row with the same words. A config that relies on one of these
trains under zero3 but not the same way, or not at all, under DeepSpeed.

| Combination | DeepSpeed | Where in DeepSpeed | zero3 |
|---|---|---|---|
| `mics_shard_size` below the world size (replicas) with `offload_optimizer` cpu or nvme | refuses at the first optimizer step: "Local sharding has no support for CPU offloading" | `runtime/zero/mics.py`, `MiCS_Optimizer.allreduce_mics_shard_grads`: the gradient partitions to all-reduce across the replicas are in host memory | all-reduces the slices across the replicas on the device, then offloads: the same bits as without offload (`tests/dist/test_mics_offload.cpp`, `ctest -L engine`) |
| `mics_shard_size` with `zero_quantized_weights` (qwZ) | drops qwZ without a word: MiCS gathers in the compute dtype | `runtime/zero/mics.py`, `MiCS_Init`: its `all_gather_coalesced` never quantizes; `runtime/engine.py` `_return_mics_optimizer` passes no `zero_quantized_weights` | quantizes every gather of the shard group, hierarchical ones through both stages (docs/quantization.md; `QuantizedWeights` in `tests/dist/test_quantized_collectives.cpp`) |
| `mics_shard_size` with `zero_quantized_gradients` (qgZ) | drops qgZ without a word: reduce-scatter in `communication_data_type` | `runtime/engine.py` `_return_mics_optimizer` passes no `all2all_process_group`, without which `runtime/zero/stage3.py` never calls `all_to_all_quant_reduce` | the int4 all-to-all within the shard group; the replica all-reduce unquantized (docs/quantization.md) |
| `zero_hpz_partition_size` with `offload_param` cpu | keeps the secondary partition in host memory | `runtime/zero/partition_parameters.py`, `Init._partition_param_sec`: the secondary tensor is allocated on the offload device | keeps it on the GPU unless `zero3.hpz_secondary_memory` is "host" (DeepSpeed's placement) |
| `zero_hpz_partition_size` with `offload_param` nvme | has no NVMe place for the secondary partition (read in the source, not run) | `runtime/zero/partition_parameters.py`, `Init._partition_param_sec`: `torch.empty` on device "nvme", which is no torch device | fills the secondary partition from the NVMe swap (`tests/dist/test_hpz_offload.cpp`) |
| `zero3.hpz_secondary_memory` "host" without `offload_param` | keeps the secondary partition on the GPU (the `zero3` section is zero3's) | `Init._partition_param_sec` as above: the offload device is the GPU | pinned host memory, copied up before each gather from it |

## Fuzzing the reader

`tests/fuzz/fuzz_config.cpp` is a libFuzzer target (built with ASan and UBSan, from the config sources
themselves). Each input is the text of a config: `parse_config` must accept it or throw `ConfigError`;
an accepted one is resolved with a fixed program, and a resolved one must be written by `to_json` as a
config that reads and resolves back to the same text. The seeds are every config of the repository
(configs/ and tests/data/configs/), and `tests/fuzz/config.dict` holds the key names:

    cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DZERO3_CUDA=OFF -DZERO3_FUZZ=ON
    cmake --build build-fuzz --target fuzz_config
    ctest --test-dir build-fuzz -L fuzz -R config    # seed replay + 20,000 runs with seed 1
    mkdir -p /tmp/work && build-fuzz/bin/fuzz_config -max_total_time=300 -max_len=4096 \
        -dict=tests/fuzz/config.dict /tmp/work configs tests/data/configs/seeds tests/data/configs/real tests/data/configs/bad

Runs (2026-11-25, the 2-core development machine, clang 14, ASan + UBSan): 300 s with `-max_len=4096`
from the seeds, 388,684 executions, 3,043 edges; then 180 s with `-max_len=65536` from that corpus,
182,645 executions, 3,060 edges. No crash, no sanitizer report, no broken round trip.
)";

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string code(std::string_view text) { return text.empty() ? "—" : "`" + std::string(text) + "`"; }

std::string when_text(When w) {
  switch (w) {
    case When::not_default:
      return "when not the default";
    case When::enabled:
      return "when enabled";
    case When::present:
      return "when given";
    case When::above_one:
      return "when above 1";
  }
  return "";
}

std::string status_text(const KeyEntry& e) {
  switch (e.status) {
    case KeyStatus::supported:
      return "supported";
    case KeyStatus::alias:
      return "alias of " + code(e.alias_of);
    case KeyStatus::deprecated:
      return e.alias_of.empty() ? std::string("deprecated (warning)")
                                : "deprecated (warning): read as " + code(e.alias_of);
    case KeyStatus::ignored:
      return "ignored (warning " + when_text(e.when) + ")";
    case KeyStatus::refused:
      return "**refused** " + when_text(e.when);
  }
  return "";
}

std::string row(const KeyEntry& e) {
  const KeyEntry* target = e.alias_of.empty() ? nullptr : config_detail::find_key(e.alias_of);
  std::string type(e.type.empty() && target ? target->type : e.type);
  std::string doc(e.doc);
  if (doc.empty() && target) doc = "Same as " + code(target->path) + ".";
  if (!e.only_for.empty()) {
    std::string types(e.only_for);
    for (char& c : types) {
      if (c == ' ') c = '/';
    }
    doc += " Scheduler types: " + types + ".";
  }
  std::string def(e.default_json.empty() && target ? target->default_json : e.default_json);
  return "| " + code(e.path) + " | " + escape(type) + " | " + escape(code(def)) + " | " + status_text(e) + " | " +
         escape(doc) + " |\n";
}

constexpr const char* kHeader = "| Key | Type | Default | zero3 | Description |\n|---|---|---|---|---|\n";

bool has_children(std::string_view section) {
  for (const KeyEntry& e : config_detail::key_table()) {
    if (config_detail::parent_of(e.path) == section) return true;
  }
  return false;
}

bool under(std::string_view path, std::string_view section) {
  return path.size() > section.size() && path.substr(0, section.size()) == section && path[section.size()] == '.';
}

}  // namespace

std::string config_reference_markdown() {
  const auto& table = config_detail::key_table();
  std::string md = kIntro;
  md += "\n## Top-level keys\n\n";
  md += kHeader;
  for (const KeyEntry& e : table) {
    if (config_detail::parent_of(e.path).empty() && !has_children(e.path) &&
        !(e.status == KeyStatus::deprecated && e.alias_of == "bf16")) {
      if (e.is_section()) continue;  // listed with the other sections below
      md += row(e);
    }
  }
  for (const KeyEntry& e : table) {
    if (!config_detail::parent_of(e.path).empty() || !has_children(e.path)) continue;
    md += "\n## " + code(e.path) + "\n\n" + escape(e.doc) + "\n\n" + kHeader;
    md += row(e);
    for (const KeyEntry& d : table) {
      if (under(d.path, e.path)) md += row(d);
    }
    // The deprecated other name of this section, if any.
    for (const KeyEntry& d : table) {
      if (config_detail::parent_of(d.path).empty() && d.alias_of == e.path) md += row(d);
    }
  }
  md +=
      "\n## Other DeepSpeed sections\n\nSections of DeepSpeed features outside ZeRO. zero3 does not look inside "
      "them.\n\n";
  md += kHeader;
  for (const KeyEntry& e : table) {
    if (config_detail::parent_of(e.path).empty() && e.is_section() && !has_children(e.path) && e.alias_of.empty()) {
      md += row(e);
    }
  }
  return md;
}

}  // namespace zero3
