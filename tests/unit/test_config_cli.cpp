// `zero3 config check` and `zero3 config docs`, run as the real command: every config in configs/ and
// every DeepSpeed config quoted in the seed notes is accepted, every file in tests/data/configs/bad/ is
// refused with the message it names.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero3/config.hpp"

using json = nlohmann::json;

namespace {

struct CliResult {
  int status = -1;
  std::string out, err;
};

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (!v) ADD_FAILURE() << name << " is not set (ctest sets it; set it when running by hand)";
  return v ? v : "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `zero3 <args>` with an optional environment prefix; captures stdout and stderr.
CliResult run_zero3(const std::string& args, const std::string& env = "") {
  static int counter = 0;
  std::string err_path =
      testing::TempDir() + "zero3_cli_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  std::string cmd = env + (env.empty() ? "" : " ") + env_or_fail("ZERO3_BIN_DIR") + "/zero3 " + args + " 2>" + err_path;
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err_path);
  std::remove(err_path.c_str());
  return r;
}

std::vector<std::string> json_files(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return files;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.substr(name.size() - 5) == ".json") files.push_back(dir + "/" + name);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

std::string src(const std::string& rel) { return env_or_fail("ZERO3_SOURCE_DIR") + "/" + rel; }

// The flags a run of the seed's job passes: 4 nodes x 4 GPUs, Llama-3-8B, micro batch 4, grad accum 4.
constexpr const char* kSeedFlags = "--world-size 16 --hidden-size 4096 --micro-batch 4 --grad-accum 4";

}  // namespace

TEST(ConfigCli, SeedConfigResolvesAsTheSeedRunDid) {
  CliResult r =
      run_zero3("config check " + src("configs/llama-3-8b-stage3.json") + " " + kSeedFlags + " --precision bf16");
  ASSERT_EQ(r.status, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["train_batch_size"], 256);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(j["gradient_accumulation_steps"], 4);
  EXPECT_EQ(j["gradient_clipping"], 1.0);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["zero_optimization"]["stage"], 3);
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 16777216);
  EXPECT_EQ(j["zero_optimization"]["stage3_prefetch_bucket_size"], 15099494);
  EXPECT_EQ(j["zero_optimization"]["stage3_param_persistence_threshold"], 40960);
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["pin_memory"], true);
  EXPECT_EQ(j["zero_optimization"]["sub_group_size"], 1000000000);
  j.erase("zero3");  // its choices include "auto"
  EXPECT_EQ(j.dump().find("\"auto\""), std::string::npos) << r.out;
  // What "auto" became is said on stderr.
  EXPECT_NE(r.err.find("stage3_prefetch_bucket_size: \"auto\" -> 15099494"), std::string::npos) << r.err;
}

TEST(ConfigCli, SeedConfigIsVerbatim) {
  // configs/llama-3-8b-stage3.json is the block quoted in the seed notes, byte for byte.
  std::string seed = read_file(src("tests/data/configs/seeds/002-llama-3-8b-stage3.json"));
  EXPECT_FALSE(seed.empty());
  EXPECT_EQ(read_file(src("configs/llama-3-8b-stage3.json")), seed);
}

TEST(ConfigCli, AcceptsEveryConfigInConfigs) {
  std::vector<std::string> files = json_files(src("configs"));
  ASSERT_GE(files.size(), 7u);
  for (const std::string& f : files) {
    CliResult r = run_zero3("config check " + f + " " + kSeedFlags + " --precision bf16");
    EXPECT_EQ(r.status, 0) << f << ": " << r.err;
    json j = json::parse(r.out);
    EXPECT_EQ(j["train_batch_size"], 256) << f;
    EXPECT_EQ(r.err.find("WARN"), std::string::npos) << f << ": " << r.err;
  }
  // The canonical ones need no flag but the world size.
  for (const char* name :
       {"zero-stage0", "zero-stage1", "zero-stage2", "zero-stage3", "zero3-offload-cpu", "zero3-offload-nvme"}) {
    CliResult r = run_zero3("config check " + src(std::string("configs/") + name + ".json"));
    EXPECT_EQ(r.status, 0) << name << ": " << r.err;
    EXPECT_EQ(json::parse(r.out)["train_batch_size"], 16) << name;
  }
}

// DeepSpeed's ZeRO++ tutorial config: hpZ over 16 ranks with qwZ and qgZ, accepted as it stands (the precision is
// the program's), refused naming the key once the program says fp32.
TEST(ConfigCli, AcceptsDeepSpeedsZeroPlusPlusTutorialConfig) {
  const std::string file = src("tests/data/configs/real/deepspeed-zeropp-tutorial.json");
  for (const char* precision : {"", " --precision bf16", " --precision fp16"}) {
    CliResult r = run_zero3("config check " + file + " --world-size 64 --micro-batch 4 --grad-accum 1" + precision);
    ASSERT_EQ(r.status, 0) << precision << ": " << r.err;
    json j = json::parse(r.out);
    EXPECT_EQ(j["zero_optimization"]["zero_quantized_weights"], true);
    EXPECT_EQ(j["zero_optimization"]["zero_quantized_gradients"], true);
    EXPECT_EQ(j["zero_optimization"]["zero_hpz_partition_size"], 16);
    EXPECT_EQ(j["zero3"]["qwz_block_size"], 2048);
    EXPECT_EQ(j["zero3"]["qgz_block_size"], 2048);
  }
  CliResult r = run_zero3("config check " + file + " --world-size 64 --micro-batch 4 --grad-accum 1 --precision fp32");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("zero_optimization.zero_quantized_weights: got true with fp32 compute"), std::string::npos)
      << r.err;
}

TEST(ConfigCli, CanonicalStagesAndOffloads) {
  for (int stage = 0; stage <= 3; ++stage) {
    CliResult r = run_zero3("config check " + src("configs/zero-stage" + std::to_string(stage) + ".json"));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["zero_optimization"]["stage"], stage);
  }
  json cpu = json::parse(run_zero3("config check " + src("configs/zero3-offload-cpu.json")).out);
  EXPECT_EQ(cpu["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(cpu["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  json nvme = json::parse(run_zero3("config check " + src("configs/zero3-offload-nvme.json")).out);
  EXPECT_EQ(nvme["zero_optimization"]["offload_param"]["device"], "nvme");
  EXPECT_EQ(nvme["zero_optimization"]["offload_param"]["nvme_path"], "/tmp/zero3-nvme");
  EXPECT_EQ(nvme["zero_optimization"]["offload_optimizer"]["nvme_path"], "/tmp/zero3-nvme");
}

TEST(ConfigCli, AcceptsEveryDeepSpeedConfigQuotedInTheSeeds) {
  std::vector<std::string> files = json_files(src("tests/data/configs/seeds"));
  ASSERT_EQ(files.size(), 5u);
  // The values each one resolves to on the seed's 16-rank job (micro batch given only where "auto").
  struct Expect {
    const char* file;
    const char* flags;
    int stage;
    int64_t train_batch_size;
    const char* offload_param;
  } expects[] = {
      {"002-llama-3-8b-stage3.json", "--hidden-size 4096 --micro-batch 4 --grad-accum 4", 3, 256, "cpu"},
      {"003-ds-config-stage2-fp16-adamw-warmuplr.json", "", 2, 160, "none"},
      {"003-zero2-offload-optimizer-cpu.json", "", 2, 256, "none"},
      {"003-zero3-offload-param-optimizer-cpu.json", "", 3, 256, "cpu"},
      {"003-zero3-offload-nvme.json", "", 3, 256, "nvme"},
  };
  for (const Expect& e : expects) {
    std::string f = src(std::string("tests/data/configs/seeds/") + e.file);
    CliResult r = run_zero3("config check " + f + " --world-size 16 " + e.flags);
    ASSERT_EQ(r.status, 0) << e.file << ": " << r.err;
    json j = json::parse(r.out);
    EXPECT_EQ(j["zero_optimization"]["stage"], e.stage) << e.file;
    EXPECT_EQ(j["train_batch_size"], e.train_batch_size) << e.file;
    EXPECT_EQ(j["zero_optimization"]["offload_param"]["device"], e.offload_param) << e.file;
  }
  // The stage-2 tutorial config: fp16 with dynamic loss scaling, AdamW, WarmupLR.
  json j = json::parse(
      run_zero3("config check " + src("tests/data/configs/seeds/003-ds-config-stage2-fp16-adamw-warmuplr.json")).out);
  EXPECT_EQ(j["fp16"]["enabled"], true);
  EXPECT_EQ(j["fp16"]["loss_scale"], 0.0);
  EXPECT_EQ(j["optimizer"]["type"], "AdamW");
  EXPECT_EQ(j["optimizer"]["params"]["weight_decay"], 3e-7);
  EXPECT_EQ(j["scheduler"]["type"], "WarmupLR");
  EXPECT_EQ(j["scheduler"]["params"]["warmup_num_steps"], 500);
  EXPECT_EQ(j["zero_optimization"]["allgather_bucket_size"], 200000000);
  // The NVMe example's path is a placeholder: config check accepts it, a run (--check-paths) does not.
  CliResult r = run_zero3("config check --check-paths " + src("tests/data/configs/seeds/003-zero3-offload-nvme.json"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("zero_optimization.offload_param.nvme_path: \"/path/to/my/fast_nvme_storage\""),
            std::string::npos)
      << r.err;
}

TEST(ConfigCli, HuggingFaceAutoConfig) {
  std::string f = src("tests/data/configs/hf-zero3-auto.json");
  CliResult r = run_zero3("config check " + f + " " + kSeedFlags);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--precision"), std::string::npos) << r.err;
  r = run_zero3("config check " + f + " " + kSeedFlags +
                " --precision fp16 --lr 2e-5 --total-steps 50 --warmup-steps 5");
  ASSERT_EQ(r.status, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["fp16"]["enabled"], true);
  EXPECT_EQ(j["bf16"]["enabled"], false);
  EXPECT_EQ(j["optimizer"]["params"]["lr"], 2e-5);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], json::parse("[0.9, 0.999]"));
  EXPECT_EQ(j["scheduler"]["params"]["warmup_max_lr"], 2e-5);
  EXPECT_EQ(j["scheduler"]["params"]["total_num_steps"], 50);
  EXPECT_EQ(j["scheduler"]["params"]["warmup_num_steps"], 5);
  EXPECT_EQ(j["train_batch_size"], 256);
}

// ZeRO++'s hpZ as public configs ask for it (InternVL's zero_stage3_config_100b.json with zero_hpz_partition_size 8:
// one secondary partition per node of 8 GPUs), on 2 such nodes.
TEST(ConfigCli, AcceptsInternVlStyleHpzConfigs) {
  std::string f = src("tests/data/configs/internvl-zero3-hpz.json");
  CliResult r = run_zero3("config check " + f +
                          " --world-size 16 --hidden-size 4096 --micro-batch 1 --grad-accum 4 --precision bf16 "
                          "--lr 2e-5 --weight-decay 0.05 --max-grad-norm 1.0");
  ASSERT_EQ(r.status, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["zero_optimization"]["zero_hpz_partition_size"], 8);
  EXPECT_EQ(j["zero_optimization"]["mics_shard_size"], -1);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  // Its groups must tile the world.
  r = run_zero3("config check " + f +
                " --world-size 12 --hidden-size 4096 --micro-batch 1 --grad-accum 4 --precision bf16 --lr 2e-5 "
                "--weight-decay 0.05 --max-grad-norm 1.0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("zero_optimization.zero_hpz_partition_size: got 8 with a world size of 12"), std::string::npos)
      << r.err;
}

TEST(ConfigCli, WarningsGoToStderr) {
  CliResult r = run_zero3("config check " + src("tests/data/configs/commented-legacy.json") + " --world-size 2");
  ASSERT_EQ(r.status, 0) << r.err;
  json j = json::parse(r.out);  // stdout is only the JSON
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(j["aio"]["intra_op_parallelism"], 2);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["train_batch_size"], 32);
  EXPECT_NE(r.err.find("zero_optimization.cpu_offload: deprecated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("aio.thread_count: deprecated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bfloat16: deprecated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("unknown top-level keys"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"my_experiment_name\""), std::string::npos) << r.err;
}

TEST(ConfigCli, RefusesEveryBadConfigWithItsMessage) {
  std::vector<std::string> files = json_files(src("tests/data/configs/bad"));
  ASSERT_GE(files.size(), 20u);
  for (const std::string& f : files) {
    // Each file says what it expects in its leading comments: "// flags: ..." and "// expect: ...".
    std::string flags;
    std::vector<std::string> expects;
    std::istringstream lines(read_file(f));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("// flags: ", 0) == 0) flags = line.substr(10);
      if (line.rfind("// expect: ", 0) == 0) expects.push_back(line.substr(11));
    }
    ASSERT_FALSE(expects.empty()) << f;
    CliResult r = run_zero3("config check " + f + " " + flags);
    EXPECT_EQ(r.status, 1) << f;
    EXPECT_TRUE(r.out.empty()) << f << ": " << r.out;
    for (const std::string& e : expects)
      EXPECT_NE(r.err.find(e), std::string::npos) << f << ": '" << e << "' not in " << r.err;
  }
}

TEST(ConfigCli, AcceptsTheRealConfigForms) {
  // tests/data/configs/real/: forms of published configs that DeepSpeed and Accelerate run; each file
  // names in "// flags: ..." the facts of a program it runs with. test_config_real_forms.cpp checks the
  // values; here the command accepts each one and leaves no "auto".
  std::vector<std::string> files = json_files(src("tests/data/configs/real"));
  ASSERT_GE(files.size(), 7u);
  for (const std::string& f : files) {
    std::string flags;
    std::istringstream lines(read_file(f));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("// flags: ", 0) == 0) flags = line.substr(10);
    }
    CliResult r = run_zero3("config check " + f + " " + flags);
    ASSERT_EQ(r.status, 0) << f << ": " << r.err;
    json j = json::parse(r.out);
    j.erase("zero3");
    EXPECT_EQ(j.dump().find("\"auto\""), std::string::npos) << f << ": " << r.out;
  }
  CliResult r = run_zero3("config check " + src("tests/data/configs/real/zero0-offload-param.json") +
                          " --precision fp16 --world-size 8");
  EXPECT_NE(r.err.find("WARN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.offload_param: ignored at zero_optimization.stage 0"), std::string::npos)
      << r.err;
  EXPECT_EQ(json::parse(r.out)["zero_optimization"]["offload_param"]["device"], "none");
  r = run_zero3("config check " + src("tests/data/configs/real/axolotl-zero3-bf16.json") +
                " --precision bf16 --hidden-size 4096 --micro-batch 4 --grad-accum 4");
  EXPECT_EQ(json::parse(r.out)["zero_optimization"]["sub_group_size"], 9223372036854775807);
  EXPECT_NE(r.err.find("sub_group_size: 0 read as 9223372036854775807"), std::string::npos) << r.err;
  const std::string gather = src("tests/data/configs/real/accelerate-zero3-offload-gather-auto.json") +
                             " --precision fp16 --hidden-size 4096 --micro-batch 4 --lr 2e-5 --weight-decay 0.01 "
                             "--warmup-steps 10 --total-steps 100";
  r = run_zero3("config check " + gather);
  EXPECT_EQ(json::parse(r.out)["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"], false);
  r = run_zero3("config check " + gather + " --save-16bit-model true");
  EXPECT_EQ(json::parse(r.out)["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"], true);
}

// Inputs that once crashed or hung `zero3 config check`, and their neighbours. Each run is killed after
// 10 s (`timeout` then exits 137): every one must end by itself with exit status 1 and a message naming
// the file or the key.
TEST(ConfigCli, NoInputCrashesOrHangsTheCommand) {
  const std::string dir = testing::TempDir() + "zero3_cli_hostile_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name, std::ios::binary) << text;
    return dir + "/" + name;
  };
  auto nested = [](const std::string& open, const std::string& close, int depth) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += open;
    for (int i = 0; i < depth; ++i) s += close;
    return s;
  };
  const std::string fifo = dir + "/fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string silent_fifo = dir + "/silent-fifo.json";
  ASSERT_EQ(::mkfifo(silent_fifo.c_str(), 0600), 0);
  int silent_writer = ::open(silent_fifo.c_str(), O_RDWR | O_NONBLOCK);  // holds it open, writes nothing
  ASSERT_GE(silent_writer, 0);
  const std::string large = file("large.json", "{}");
  ASSERT_EQ(::truncate(large.c_str(), 17 << 20), 0);
  std::string nul = "{\"train_batch_size\": 8}";
  nul += '\0';
  const std::string autos = file("autos.json", R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto"}, "train_micro_batch_size_per_gpu": "auto"})");

  struct Case {
    std::string args, expect;
  } cases[] = {
      {file("deep-array.json", "{\"train_batch_size\": " + nested("[", "]", 100000) + "}"),
       "train_batch_size[0][0][0]"},
      {file("deep-object.json", nested("{\"a\": ", "}", 100000)), "a.a.a.a"},
      {file("number.json", R"({"gradient_clipping": 1e400})"), "gradient_clipping: the number 1e400 is out of range"},
      {file("nul.json", nul), "nul.json:1:24: a NUL byte"},
      {file("long-key.json", "{\"aio\": {\"" + std::string(4 << 20, 'k') + "\": 1}}"), "aio.kkk"},
      {dir, dir + ": is a directory"},
      {large, "large.json: the config file has 17825792 bytes (17 MiB), more than the cap"},
      {"/dev/zero", "/dev/zero: the config file goes on past the cap"},
      {fifo, "fifo.json: no JSON in it"},
      {silent_fifo, "silent-fifo.json: no end of input after 5 s"},
      {autos + " --hidden-size 4294967296 --micro-batch 1",
       "reduce_bucket_size: \"auto\" is hidden_size^2, which for hidden size 4294967296"},
      {autos + " --hidden-size 64 --micro-batch 4611686018427387904 --world-size 4",
       "train_micro_batch_size_per_gpu 4611686018427387904 x gradient_accumulation_steps 1 x world size 4"},
  };
  for (const Case& c : cases) {
    CliResult r = run_zero3("config check " + c.args, "timeout -s KILL 10");
    EXPECT_EQ(r.status, 1) << c.args.substr(0, 200) << " (137: killed after 10 s; -1: ended by a signal)\n"
                           << r.err.substr(0, 2000);
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.expect << " not in " << r.err.substr(0, 2000);
    EXPECT_LT(r.err.size(), 4000u) << "the message of " << c.args.substr(0, 200) << " is " << r.err.size() << " bytes";
  }
  ::close(silent_writer);
  std::system(("rm -rf " + dir).c_str());
}

TEST(ConfigCli, SwapDirOverridesNvmePath) {
  std::string dir = testing::TempDir() + "zero3_swap_cli";
  std::string cmd = "mkdir -p " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  CliResult r = run_zero3("config check --check-paths " + src("tests/data/configs/seeds/003-zero3-offload-nvme.json"),
                          "ZERO3_SWAP_DIR=" + dir);
  ASSERT_EQ(r.status, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["nvme_path"], dir);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["nvme_path"], dir);
  EXPECT_NE(r.err.find("replaced by ZERO3_SWAP_DIR"), std::string::npos) << r.err;
}

TEST(ConfigCli, OutputIsAcceptedAgainUnchanged) {
  CliResult first = run_zero3("config check " + src("configs/llama-3-8b-stage3.json") + " " + kSeedFlags);
  ASSERT_EQ(first.status, 0) << first.err;
  std::string path = testing::TempDir() + "zero3_cli_roundtrip.json";
  std::ofstream(path) << first.out;
  CliResult second = run_zero3("config check " + path + " --world-size 16");
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_EQ(second.out, first.out);
  std::remove(path.c_str());
}

TEST(ConfigCli, UsageErrors) {
  CliResult r = run_zero3("config");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("usage: zero3 config check"), std::string::npos) << r.err;
  r = run_zero3("config check");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("needs a FILE"), std::string::npos) << r.err;
  r = run_zero3("config check x.json --world-size zero");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--world-size: got 'zero'"), std::string::npos) << r.err;
  r = run_zero3("config check x.json --precision int8");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--precision"), std::string::npos) << r.err;
  // Numbers the flags cannot hold, or that are not finite.
  for (const char* bad : {"--hidden-size 99999999999999999999", "--world-size -4", "--micro-batch 0", "--lr 1e400",
                          "--lr nan", "--weight-decay -1", "--max-config-bytes 0", "--save-16bit-model yes"}) {
    r = run_zero3(std::string("config check x.json ") + bad);
    EXPECT_EQ(r.status, 2) << bad;
    std::string flag(bad, std::string(bad).find(' '));
    EXPECT_NE(r.err.find(flag + ": got '"), std::string::npos) << bad << ": " << r.err;
  }
  r = run_zero3("config check x.json --frobnicate 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown flag --frobnicate"), std::string::npos) << r.err;
  r = run_zero3("config check /nonexistent.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent.json: cannot open"), std::string::npos) << r.err;
  r = run_zero3("config check --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--hidden-size"), std::string::npos);
  // --flag=value works as well as --flag value.
  r = run_zero3("config check " + src("configs/zero-stage3.json") + " --world-size=4");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["train_batch_size"], 64);
}

TEST(ConfigCli, DocsCommandPrintsTheReference) {
  CliResult r = run_zero3("config docs");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, zero3::config_reference_markdown());
  EXPECT_EQ(r.out, read_file(src("docs/config.md")))
      << "docs/config.md is stale: run `build/bin/zero3 config docs > docs/config.md`";
}
