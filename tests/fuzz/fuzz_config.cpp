// libFuzzer target for the config reader. Each input is the text of a config file. parse_config must
// either accept it or throw ConfigError; an accepted config is resolved with a fixed program (which may
// refuse it with a ConfigError), and a resolved one must be written by to_json as a config that reads and
// resolves back to the same text. Any other exception, crash, sanitizer report or broken round trip is a
// bug. docs/config.md ("Fuzzing the reader") says how to run it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "zero3/config.hpp"
#include "zero3/error.hpp"
#include "zero3/log.hpp"

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

zero3::ResolveInputs program() {
  zero3::ResolveInputs in;
  in.world_size = 2;
  in.hidden_size = 64;
  in.micro_batch = 2;
  in.grad_accum = 3;
  in.lr = 1e-4;
  in.total_steps = 100;
  in.warmup_steps = 10;
  return in;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zero3::log::set_level(zero3::LogLevel::error);
  ::unsetenv("ZERO3_SWAP_DIR");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  zero3::Config c;
  try {
    c = zero3::parse_config(text, "fuzz.json");
    resolve(c, program());
  } catch (const zero3::ConfigError&) {
    return 0;
  }
  const std::string written = to_json(c);
  try {
    zero3::Config again = zero3::parse_config(written, "written.json");
    resolve(again, program());
    if (to_json(again) != written) broken("round trip", written + "\nread back as\n" + to_json(again));
  } catch (const zero3::ConfigError& e) {
    broken("the written config is refused", std::string(e.what()) + "\n" + written);
  }
  return 0;
}
