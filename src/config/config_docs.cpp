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
the optimizer and scheduler "auto" values) and `--check-paths` (also check that NVMe directories
exist and are writable, as a run does when it starts).

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

**Batch sizes** follow DeepSpeed's rule: `train_batch_size` = `train_micro_batch_size_per_gpu` x
`gradient_accumulation_steps` x world size. Given two, the third is inferred; given only the batch
size or only the micro batch, gradient accumulation is 1. All three must then agree exactly.

## Cross-key checks

- `zero_optimization.offload_param` needs stage 3; `offload_optimizer` needs stage 1, 2 or 3; an
  `offload_optimizer.ratio` below 1 needs stage 3.
- `"device": "nvme"` needs `nvme_path` (or `ZERO3_SWAP_DIR`, which replaces every `nvme_path`). When
  a run starts the directory must exist and be writable. The canonical configs
  (`configs/zero3-offload-nvme.json`) use `/tmp/zero3-nvme`: create it, or point `nvme_path` at a
  directory on a fast local NVMe disk.
- `fp16.enabled` and `bf16.enabled` cannot both be true.
- `zero3.comm_backend` "nccl" needs a CUDA device; `zero3.network` "efa" needs NCCL.

Environment variables (`ZERO3_*`) are listed by `zero3 env`; they are declared in
src/core/env_knobs.def.
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
