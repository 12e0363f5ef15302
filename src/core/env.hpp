// ZERO3_* environment variables: one list (env_knobs.def), each with a default and a line of doc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero3::env {

#define X_STRING std::string
#define X_INT int64_t
#define X(fn, var, kind, def, doc) X_##kind fn();
#include "core/env_knobs.def"
#undef X
#undef X_STRING
#undef X_INT

struct Knob {
  const char* name;
  const char* default_value;
  const char* doc;
  std::string current;  // empty when unset
};

// Every knob with its current value, for `zero3 env`.
std::vector<Knob> all_knobs();

}  // namespace zero3::env
