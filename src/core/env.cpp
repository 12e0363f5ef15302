#include "core/env.hpp"

#include <cstdlib>
#include <string>

#include "zero3/log.hpp"

namespace zero3::env {
namespace {

std::string read_string(const char* var, const char* def) {
  const char* v = std::getenv(var);
  return v ? std::string(v) : std::string(def);
}

int64_t read_int(const char* var, int64_t def) {
  const char* v = std::getenv(var);
  if (!v || !*v) return def;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0') {
    log::warn(var, "='", v, "' is not an integer; using the default ", def);
    return def;
  }
  return x;
}

}  // namespace

#define X_STRING(var, def) read_string(#var, def)
#define X_INT(var, def) read_int(#var, def)
#define X(fn, var, kind, def, doc)                  \
  decltype(fn()) fn() {                             \
    static const auto value = X_##kind(var, def);   \
    return value;                                   \
  }
#include "core/env_knobs.def"
#undef X

std::vector<Knob> all_knobs() {
  std::vector<Knob> knobs;
#define X(fn, var, kind, def, doc)                   \
  {                                                  \
    const char* v = std::getenv(#var);               \
    knobs.push_back({#var, #def, doc, v ? v : ""});  \
  }
#include "core/env_knobs.def"
#undef X
  return knobs;
}

}  // namespace zero3::env
