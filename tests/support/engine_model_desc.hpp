// The model as the memory plan sees it (memory_plan.hpp's ModelDesc), read from an engine's declared units and their
// parameters' shapes: for tests that hold the engine's counters against plan_memory().
#pragma once

#include <utility>

#include "zero3/engine.hpp"
#include "zero3/memory_plan.hpp"

namespace zero3::testing {

inline ModelDesc model_desc_of(const Engine& engine, const char* name = "mlp") {
  ModelDesc m;
  m.name = name;
  for (size_t i = 0; i < engine.num_units(); ++i) {
    const UnitInfo& u = engine.unit(UnitId{static_cast<int32_t>(i)});
    UnitDesc d{u.name, {}};
    for (ParamId p : u.params) d.params.push_back(engine.param(p).shape);
    m.units.push_back(std::move(d));
  }
  return m;
}

}  // namespace zero3::testing
