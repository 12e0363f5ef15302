// A parameter's ParamInit rule (include/zero3/unit.hpp) as the Philox fill the kernels run
// (kernels/philox_init.hpp). The one mapping the engine and the tests' reference model both use, so the two
// draw the same initial values.
#pragma once

#include "kernels/philox_init.hpp"
#include "zero3/error.hpp"
#include "zero3/unit.hpp"

namespace zero3::detail {

// InvalidArgument for a reader rule: its values come from the caller, not from a fill.
inline FillSpec param_fill(const ParamInit& init) {
  switch (init.kind()) {
    case ParamInit::Kind::zeros:
      return FillSpec::zeros();
    case ParamInit::Kind::ones:
      return FillSpec::ones();
    case ParamInit::Kind::constant:
      return FillSpec::constant(init.value());
    case ParamInit::Kind::normal:
      return FillSpec::normal(init.mean(), init.stddev());
    case ParamInit::Kind::uniform:
      return FillSpec::uniform(init.low(), init.high());
    case ParamInit::Kind::reader:
      break;
  }
  throw InvalidArgument("param_fill: a reader ParamInit has no fill rule");
}

}  // namespace zero3::detail
