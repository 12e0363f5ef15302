#!/usr/bin/env python3
"""The summary of a GPU run (scripts/gpu-run.sh): reads the run's folder and prints what it found.

    gpu-summary.py RUN_DIR                  the summary of one run (gpu-run.sh writes it to RUN_DIR/summary.txt)
    gpu-summary.py --check-fixtures DIR     every DIR/*/ holds a sample run (run/) and expected.txt: lines
                                            "+ text" that the summary must contain, "- text" that it must not

A run folder holds run.json (mode, deadline), env.txt ("key: value"), steps.tsv (step, status, seconds, expected,
note), tests/PROGRAM[.multi].{status,json,log,cudnn.log}, model/RUN.{meta,csv,log,plan,cudnn.log},
ctest/STEP.{log,status} (the libtorch and pipeline steps, run through ctest), peer/fsdp2_*.json, bench/*.log and
gpu-clocks.csv (nvidia-smi, once a second). Any of them may be missing, empty or cut short: a run stopped at its
deadline, a program that crashed or hung is summarised as far as it went. Every problem is a line that starts with
"FAILURE:"; a step that was skipped is not a failure. The writer never raises: a section it cannot read becomes a
FAILURE line naming the section and the error, and the other sections are still written.

Throughput and MFU are the runs' figures over the mean step time of the timed steps (tokens per step / mean step
time), as the FSDP2 peer reports its own; MFU is against the datasheet's dense bf16 peak (llama3_train's and the
peer's) and, when the run measured one (bench_cuda_gemm), against the bf16 GEMM ceiling of this GPU.

The 8B extrapolation: step time is linear in the layer count, t(L) = a + b L, so with runs of 2 and 6 layers
b = (t6 - t2) / 4 (the per-layer time) and t32 = t2 + 30 b. MFU x t is the run's model FLOPs over the peak rate,
also linear in L, so MFU32 = (m2 t2 + 30 (m6 t6 - m2 t2) / 4) / t32: no FLOP count or peak is needed beyond
llama3_train's own MFU of each run.

Standard library only (the GPU machine's python3 runs it before anything else is known to work).
"""

import csv
import json
import math
import os
import re
import sys

STATUS_WORDS = ("ok", "FAILED", "TIMEOUT", "skipped")
DATASHEET_BF16 = 989e12  # H100 SXM / H200 dense bf16 FLOP/s, the peak llama3_train's and the peer's MFU use


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def key_values(text):
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":") if ":" in line else line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def fmt_bytes(n):
    return f"{n / 2**30:.2f} GiB"


def number(value, default=None):
    """float(value), or default when it is empty or not a number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def tail_lines(text, n, width=240):
    lines = [ln.rstrip()[:width] for ln in text.splitlines() if ln.strip()]
    return lines[-n:]


# The test output lines worth showing for a failure: gtest's failure reports and errors.
FAILURE_LINE = re.compile(r"Failure$|: error|Error:|error:|\[  FAILED  \]|terminate called|what\(\):|Segmentation fault"
                          r"|CUDNN_STATUS|NCCL (WARN|error)|CudaError|CommError")


class Summary:
    def __init__(self, run_dir):
        self.dir = run_dir
        self.lines = []
        self.failures = []
        try:
            self.run = json.loads(read(os.path.join(run_dir, "run.json"), "{}") or "{}")
        except ValueError:
            self.run = {}
        if not isinstance(self.run, dict):
            self.run = {}
        self.dry = self.run.get("mode") == "dry-run"
        self.step_status = {}
        self.zero3 = None
        self.ceiling = None

    def p(self, text=""):
        self.lines.append(text)

    def fail(self, text):
        self.failures.append("FAILURE: " + text)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    # ---- sections ----

    def header(self):
        env = key_values(read(self.path("env.txt")))
        mode = "dry run (no GPU)" if self.dry else "GPU run"
        self.p(f"zero3 GPU window: {mode}, {env.get('date', self.run.get('started', 'date unknown'))}, "
               f"deadline {self.run.get('deadline_s', '?')} s" +
               (f", steps {self.run['only']} (--only)" if self.run.get("only") else ""))
        for key in ("gpu", "driver", "cuda", "nvcc_on_path", "cudart", "cublas", "cublasLt", "cudnn", "nccl", "nvrtc",
                    "host", "cpu", "compiler", "cmake", "generator", "python", "carried"):
            if key in env:
                self.p(f"  {key:<13}{env[key]}")
        if not env:
            self.p("  (no environment report: the run stopped before its first step)")

    def steps(self):
        rows = []
        text = read(self.path("steps.tsv"))
        for row in csv.reader(text.splitlines()[1:], delimiter="\t"):
            if len(row) >= 4:
                rows.append(row + [""] * (5 - len(row)))
        self.p()
        self.p("steps (seconds taken of the budget)")
        total = 0
        for name, status, seconds, expected, note in rows[:64]:
            total += int(number(seconds, 0))
            self.p(f"  {name:<18}{status:<9}{seconds:>4} s of ~{expected} s{'   ' + note if note else ''}")
            if status in ("FAILED", "TIMEOUT"):
                self.fail(f"{name}: {status.lower()}{': ' + note if note else ''}")
        if not rows:
            self.p("  (none finished)")
        self.p(f"  total {total} s")
        self.step_status = {r[0]: r[1] for r in rows}

    def tests(self, tag, title, step):
        files = sorted(f for f in os.listdir(self.path("tests")) if f.endswith(tag + ".status")
                       and (tag or not f.endswith(".multi.status"))) if os.path.isdir(self.path("tests")) else []
        if not files:
            return
        self.p()
        self.p(title)
        for f in files:
            prog = f[: -len(".status")]
            status = key_values(read(self.path("tests", f)).replace(" ", "\n"))
            rc, secs = status.get("rc", "?"), status.get("seconds", "?")
            counts, failed = self.gtest_counts(self.path("tests", prog + ".json"))
            running = ""
            if counts is None:  # killed before gtest wrote its JSON: what its output says so far
                counts, failed, running = self.gtest_log_counts(self.path("tests", prog + ".log"))
            if rc == "none":  # the program has no test of this kind
                continue
            if rc == "skipped":
                self.p(f"  {prog:<40}skipped: the step's budget was spent")
                continue
            what = f"{counts[0]} passed, {counts[1]} failed, {counts[2]} skipped" if counts else "no results"
            if rc == "124" or rc == "137":
                what = f"timed out after {status.get('limit', '?')} s ({what} before" + \
                       (f"; running {running})" if running else ")")
            elif rc == "77":
                what = "no CUDA device (exit 77)" + (": " + self.first_line(prog, "skipped:") if self.dry else "")
            elif rc.isdigit() and int(rc) > 128:
                what = f"crashed: killed by signal {int(rc) - 128} ({what} before" + \
                       (f"; running {running})" if running else ")")
            self.p(f"  {prog:<40}{what}, {secs} s")
            for name in failed[:10]:
                self.p(f"      failed: {name}")
            if failed or (rc not in ("0", "77") and not (self.dry and rc == "77")):
                for ln in self.failure_lines(prog):
                    self.p(f"        {ln}")
                if "cudnn" in prog:
                    self.cudnn_tail(self.path("tests", prog + ".cudnn.log"))
            if self.dry and rc == "77":
                continue
            if rc in ("124", "137"):
                self.fail(f"{step}: {prog}: timed out after {status.get('limit', '?')} s")
            elif rc == "77":
                self.fail(f"{step}: {prog}: found no CUDA device")
            elif rc != "0" or failed:
                self.fail(f"{step}: {prog}: exit {rc}" + (f", failed {', '.join(failed)}" if failed else ""))

    def failure_lines(self, prog, n=6):
        """The last failure reports of a test program: gtest's JSON messages, else its output's error lines."""
        out = []
        try:
            data = json.loads(read(self.path("tests", prog + ".json")))
            for suite in data.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    for f in t.get("failures") or []:
                        out += tail_lines(str(f.get("failure", "")), 2)
        except (ValueError, AttributeError, TypeError):
            pass
        if not out:
            out = [ln for ln in tail_lines(read(self.path("tests", prog + ".log")), 400) if FAILURE_LINE.search(ln)]
        if not out:
            out = tail_lines(read(self.path("tests", prog + ".log")), 3)
        return out[-n:]

    def cudnn_tail(self, path, n=6):
        """cuDNN's own reasons (its debug log, CUDNN_LOGLEVEL_DBG): the last warning and error lines."""
        lines = [ln for ln in tail_lines(read(path), 2000) if re.search(r"E!|W!|ERROR|WARN|NOT_SUPPORTED|status", ln)]
        if lines:
            self.p(f"      cuDNN's log ({os.path.relpath(path, self.dir)}), last lines:")
            for ln in lines[-n:]:
                self.p(f"        {ln}")

    def first_line(self, prog, prefix):
        for line in read(self.path("tests", prog + ".log")).splitlines():
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        return ""

    @staticmethod
    def gtest_log_counts(path):
        """(passed, failed, skipped), the failed tests' names and the test still running, from gtest's output."""
        passed, failed, skipped, names, running = 0, 0, 0, [], ""
        for line in read(path).splitlines():
            m = re.match(r"\[ +(RUN|OK|FAILED|SKIPPED) +\] (\S+)(?: \(\d+ ms\))?$", line)
            if not m:
                continue
            word, name = m.groups()
            if word == "RUN":
                running = name
                continue
            running = ""
            if word == "OK":
                passed += 1
            elif word == "FAILED":
                failed += 1
                names.append(name)
            else:
                skipped += 1
        return ((passed, failed, skipped) if passed + failed + skipped or running else None), names, running

    @staticmethod
    def gtest_counts(path):
        try:
            data = json.loads(read(path))
        except ValueError:
            return None, []
        if not isinstance(data, dict):
            return None, []
        passed = failed = skipped = 0
        names = []
        for suite in data.get("testsuites", []):
            for t in suite.get("testsuite", []):
                if t.get("failures"):
                    failed += 1
                    names.append(f"{suite.get('name')}.{t.get('name')}")
                elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                    skipped += 1
                else:
                    passed += 1
        return (passed, failed, skipped), names

    # ---- the model runs ----

    def model_run(self, run):
        """(meta, timed rows) of model/RUN, or (meta, None) when it has no metrics."""
        meta = key_values(read(self.path("model", run + ".meta")))
        rows = list(csv.DictReader(read(self.path("model", run + ".csv")).splitlines()))
        warmup = int(number(meta.get("warmup"), 0))
        timed = [r for r in rows[warmup:] if number(r.get("step_time_s"), 0) > 0]
        return meta, timed or None

    @staticmethod
    def mean(rows, key):
        vals = [v for v in (number(r.get(key)) for r in rows) if v is not None]
        return sum(vals) / len(vals) if vals else None

    @classmethod
    def rates(cls, rows):
        """(mean step time, tokens/s, MFU) over the timed steps: tokens per step and model FLOPs per step (MFU x step
        time, a constant of the run) over the mean step time, as the FSDP2 peer computes its figures."""
        step = cls.mean(rows, "step_time_s")
        tokens = cls.mean([{"x": number(r.get("tokens_per_s"), 0) * number(r.get("step_time_s"), 0)} for r in rows], "x")
        mfu_rows = [r for r in rows if number(r.get("mfu")) is not None]
        work = cls.mean([{"x": number(r["mfu"]) * number(r.get("step_time_s"), 0)} for r in mfu_rows], "x")
        return step, tokens / step, (work / step if work is not None else None)

    def mfu_text(self, mfu):
        if mfu is None:
            return "MFU n/a"
        text = f"MFU {100 * mfu:.1f}%"
        if self.ceiling:
            text += f" ({100 * mfu * DATASHEET_BF16 / self.ceiling:.1f}% of the measured GEMM ceiling)"
        return text

    def attention(self):
        runs = sorted(f[:-4] for f in os.listdir(self.path("model")) if f.endswith(".log") and
                      not f.endswith(".cudnn.log")) \
            if os.path.isdir(self.path("model")) else []
        if not runs:
            return
        self.p()
        self.p("attention (bf16: cuDNN's fused kernels must take every call)")
        pat = re.compile(r"attention paths \((\w+), cuDNN ([\w ]+)\): fused forward (\d+), fused backward (\d+), "
                         r"unfused forward (\d+), unfused backward (\d+)")
        for run in runs:
            log = read(self.path("model", run + ".log"))
            m = pat.search(log)
            fallback = [ln.strip() for ln in log.splitlines()
                        if "falls back to the cuBLAS path" in ln or "cuDNN attention unavailable" in ln]
            if not m:
                self.p(f"  {run:<14}not reported (the run ended before its model ops were destroyed)")
                self.cudnn_tail(self.path("model", run + ".cudnn.log"))
                self.fail(f"attention: {run}: no 'attention paths' line in model/{run}.log")
                continue
            act, cudnn, ff, fb, uf, ub = m.groups()
            self.p(f"  {run:<14}fused {ff} forward, {fb} backward; unfused {uf} forward, {ub} backward "
                   f"({act}, cuDNN {cudnn})")
            for ln in fallback[:3]:
                self.p(f"      {ln[:300]}")
            if act == "bf16" and (int(uf) or int(ub) or cudnn != "loaded" or fallback):
                self.cudnn_tail(self.path("model", run + ".cudnn.log"))
                self.fail(f"attention: {run}: fell back to the unfused cuBLAS path "
                          f"({uf} forward, {ub} backward calls; cuDNN {cudnn})")

    def models(self):
        small_meta, small = self.model_run("llama-1.5b")
        self.p()
        self.p("llama3_train, one GPU, ZeRO-3, bf16, activation checkpointing")
        self.zero3 = None
        if small:
            step, tps, mfu = self.rates(small)
            peak = max(int(number(r.get("mem_device_peak"), 0)) for r in small)
            self.zero3 = (tps, peak)
            self.p(f"  1.5B ({small_meta.get('model', '?')}, micro-batch {small_meta.get('micro_batch')} x seq "
                   f"{small_meta.get('seq_len')}): {tps:,.0f} tokens/s, {step:.3f} s/step, {self.mfu_text(mfu)}, "
                   f"peak GPU {fmt_bytes(peak)} (mean step time of {len(small)} steps after {small_meta.get('warmup')})")
            self.check_losses("llama-1.5b", small)
        else:
            self.p("  1.5B: not measured")
        _, two = self.model_run("llama-8b-2l")
        meta6, six = self.model_run("llama-8b-6l")
        if two and six:
            t2, _, m2 = self.rates(two)
            t6, _, m6 = self.rates(six)
            per_layer = (t6 - t2) / 4
            t32 = t2 + 30 * per_layer
            tokens = int(number(meta6.get("micro_batch"), 1)) * int(number(meta6.get("seq_len"), 0))
            self.p(f"  8B shape, seq {meta6.get('seq_len')}, micro-batch {meta6.get('micro_batch')}: 2 layers "
                   f"{t2:.4f} s/step, 6 layers {t6:.4f} s/step; per layer {per_layer:.4f} s")
            line = f"  8B extrapolated to 32 layers: {t32:.3f} s/step, {tokens / t32:,.0f} tokens/s"
            if m2 is not None and m6 is not None:
                mfu32 = (m2 * t2 + 30 * (m6 * t6 - m2 * t2) / 4) / t32
                line += f", {self.mfu_text(mfu32)}"
            self.p(line + " (one GPU, no communication: compute per GPU of the 8B step)")
            for run, rows in (("llama-8b-2l", two), ("llama-8b-6l", six)):
                self.check_losses(run, rows)
        else:
            self.p("  8B shape: not measured")

    def check_losses(self, run, rows):
        bad = [str(r.get("step", "?")) for r in rows if number(r.get("loss")) is None]
        if bad:
            self.fail(f"{run}: loss not finite at step(s) {', '.join(bad)}")

    def peer(self):
        found = []
        for kind in ("eager", "compiled"):
            try:
                found.append((kind, json.loads(read(self.path("peer", f"fsdp2_{kind}.json")))))
            except ValueError:
                pass
        if not found:
            return
        self.p()
        self.p("PyTorch FSDP2 on the 1.5B run's model, batch and sequence (examples/llama3/tools/fsdp2_reference.py)")
        found = [(kind, r) for kind, r in found if isinstance(r, dict) and number(r.get("tokens_per_s"))]
        for kind, r in found:
            self.p(f"  {kind:<9}{number(r['tokens_per_s']):,.0f} tokens/s, {number(r.get('step_time_s'), 0):.3f} s/step, "
                   f"{self.mfu_text(number(r.get('mfu')))}, peak GPU {fmt_bytes(number(r.get('peak_gpu_bytes'), 0))} "
                   f" ({r.get('framework', '?')}" + (f"; mean step time of {r['steps_timed']} steps)" if r.get("steps_timed")
                                                else ")"))
        if self.zero3:
            tps, peak = self.zero3
            for kind, r in found:
                mem = f"{peak / number(r['peak_gpu_bytes']):.2f}" if number(r.get("peak_gpu_bytes")) else "n/a"
                self.p(f"  zero3 / FSDP2 {kind}: tokens/s {tps / number(r['tokens_per_s']):.2f}, peak memory {mem}")

    def bench(self):
        logs = sorted(f for f in os.listdir(self.path("bench")) if f.endswith(".log")) \
            if os.path.isdir(self.path("bench")) else []
        shown = [(f, read(self.path("bench", f)).splitlines()) for f in logs]
        shown = [(f, lines) for f, lines in shown if lines and not lines[0].startswith("skipped")]
        if not shown:
            return
        self.p()
        for f, lines in shown:
            self.p(f"{f[:-4]}")
            for ln in [x for x in lines if x.strip()][:30]:
                self.p("  " + ln)

    def clocks(self):
        text = read(self.path("gpu-clocks.csv"))
        rows = list(csv.reader(text.splitlines()))
        if len(rows) < 2:
            return
        head = [h.strip() for h in rows[0]]

        def column(*names):  # nvidia-smi heads a column with the field's full name ("clocks.current.sm [MHz]")
            i = next((k for k, h in enumerate(head) if h.split(" [")[0] in names), None)
            vals = []
            for r in rows[1:]:
                if i is not None and i < len(r):
                    m = re.match(r"\s*([0-9.]+)", r[i])
                    if m:
                        vals.append(float(m.group(1)))
            return vals

        sm, power = column("clocks.current.sm", "clocks.sm"), column("power.draw")
        temp = column("temperature.gpu")
        reasons = set()
        i = next((k for k, h in enumerate(head) if "reasons" in h), None)
        names = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                 0x40: "hardware thermal slowdown", 0x80: "power brake"}
        for r in rows[1:]:
            if i is not None and i < len(r):
                try:
                    bits = int(r[i].strip(), 16)
                except ValueError:
                    continue
                reasons.update(name for bit, name in names.items() if bits & bit)
        self.p()
        self.p(f"clocks ({len(rows) - 1} samples): SM {min(sm, default=0):.0f}-{max(sm, default=0):.0f} MHz, "
               f"power up to {max(power, default=0):.0f} W, temperature up to {max(temp, default=0):.0f} C; "
               f"clock limits seen: {', '.join(sorted(reasons)) or 'none'}")

    def gemm(self):
        """The bf16 GEMM ceiling measured in this run (bench_cuda_gemm), which the MFU lines are also read against."""
        m = re.search(r"bf16 GEMM (\d+)\^3 .*?([0-9.]+) TFLOP/s", read(self.path("bench", "bench_cuda_gemm.log")))
        if m and number(m.group(2)):
            self.ceiling = number(m.group(2)) * 1e12
            self.p()
            self.p(f"bf16 GEMM ceiling: {m.group(2)} TFLOP/s measured ({m.group(1)}^3, cuBLAS), "
                   f"{100 * self.ceiling / DATASHEET_BF16:.1f}% of the datasheet's {DATASHEET_BF16 / 1e12:.0f} TFLOP/s")

    def ctest_steps(self):
        """The steps run through ctest (the libtorch adapter on CUDA, the pipeline's NCCL point-to-point test)."""
        d = self.path("ctest")
        names = sorted(f[:-len(".status")] for f in os.listdir(d) if f.endswith(".status")) if os.path.isdir(d) else []
        for name in names:
            status = key_values(read(os.path.join(d, name + ".status")).replace(" ", "\n"))
            log = read(os.path.join(d, name + ".log"))
            self.p()
            self.p(f"{name} (ctest)")
            if status.get("rc") == "none":
                self.p(f"  not built: {status.get('why', 'no such test in this build').replace('_', ' ')}")
                continue
            m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", log)
            self.p(f"  {m.group(0) if m else 'no ctest result line'} (exit {status.get('rc', '?')}, "
                   f"{status.get('seconds', '?')} s)")
            failed = re.findall(r"^\s+\d+ - (\S+) \(", log.split("The following tests FAILED:")[-1], re.M) \
                if "The following tests FAILED:" in log else []
            for t in failed[:10]:
                self.p(f"      failed: {t}")
            if status.get("rc") != "0":
                for ln in [x for x in tail_lines(log, 400) if FAILURE_LINE.search(x)][-6:]:
                    self.p(f"        {ln}")
            if status.get("rc") != "0" and not (self.dry and status.get("rc") == "77"):
                self.fail(f"{name}: exit {status.get('rc', '?')}" + (f", failed {', '.join(failed[:10])}" if failed else
                                                                      ""))

    def section(self, title, method):
        try:
            method()
        except Exception as e:  # noqa: BLE001 -- the summary is written whatever a file holds
            self.fail(f"summary: the {title} section could not be read ({type(e).__name__}: {e})")

    def write(self):
        for title, method in (("environment", self.header), ("steps", self.steps), ("GEMM ceiling", self.gemm),
                              ("tests", lambda: self.tests("", "tests in one process (pass / fail / skip)", "tests")),
                              ("several-process tests", lambda: self.tests(
                                  ".multi", "tests with several NCCL processes on the GPU", "tests-multi")),
                              ("ctest steps", self.ctest_steps), ("attention", self.attention),
                              ("model", self.models), ("peer", self.peer), ("bench", self.bench),
                              ("clocks", self.clocks)):
            self.section(title, method)
        self.p()
        for f in self.failures:
            self.p(f)
        skipped = sum(1 for s in self.step_status.values() if s == "skipped")
        self.p(f"result: {len(self.failures)} failure(s), {skipped} step(s) skipped")
        return "\n".join(self.lines) + "\n"


def check_fixtures(root):
    bad = 0
    cases = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "expected.txt")))
    for case in cases:
        text = Summary(os.path.join(root, case, "run")).write()
        for line in read(os.path.join(root, case, "expected.txt")).splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            sign, want = line[0], line[2:]
            if (sign == "+") != (want in text):
                bad += 1
                print(f"{case}: the summary {'lacks' if sign == '+' else 'has'}: {want}")
        print(f"{case}: checked")
    if bad:
        print(f"{bad} expectation(s) not met")
    if not cases:
        print(f"no fixtures under {root}")
        return 1
    return 1 if bad else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--check-fixtures":
        return check_fixtures(argv[2])
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        sys.stdout.write(Summary(argv[1]).write())
    except Exception as e:  # noqa: BLE001 -- never leave summary.txt empty
        sys.stdout.write(f"zero3 GPU window: the summary writer failed ({type(e).__name__}: {e}); see the archive\n"
                         f"FAILURE: summary: {type(e).__name__}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
