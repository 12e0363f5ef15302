// Units and parameters: what a model declares to the engine.
//
// A unit is the group of parameters gathered together (a transformer layer, the embedding, the head). Its
// parameters lie one after another, in declaration order, in one flat buffer of `numel` elements, padded
// to `padded_numel` = world_size * slice_numel with slice_numel = ceil(numel / world_size). Rank r owns
// the slice [r * slice_numel, (r + 1) * slice_numel) of that buffer: its fp32 master copy, its optimizer
// state and, at stage 2 and 3, its reduced gradients. The padding holds zeros and is never visible
// through a parameter view.
//
// Declaring allocates nothing. Initial values come from a ParamInit rule, evaluated by each rank for the
// elements of its own slice only: the random rules use a counter-based generator (Philox keyed by the
// config's zero3.seed, the parameter's full name and the element's index), so the initial model is the
// same bits for every world size and every device.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zero3/dtype.hpp"

namespace zero3 {

// Index of a unit in declaration order. Stable for the engine's lifetime.
struct UnitId {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
  friend bool operator==(UnitId, UnitId) = default;
};

// Index of a parameter in declaration order over all units.
struct ParamId {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
  friend bool operator==(ParamId, ParamId) = default;
};

// How a parameter's initial values are made.
class ParamInit {
 public:
  enum class Kind { zeros, ones, constant, normal, uniform, reader };

  // Fills elements [begin, end) of the parameter (row-major flat index) into out[0, end - begin) as fp32.
  // `out` is host memory. The engine calls it from the thread that calls materialize(), once for each
  // parameter that overlaps the local slice, with the overlapping range only. Throw a zero3::Error to
  // make materialize() fail; the engine adds the parameter's name to the message.
  using Reader = std::function<void(int64_t begin, int64_t end, float* out)>;

  static ParamInit zeros() { return ParamInit(Kind::zeros); }
  static ParamInit ones() { return ParamInit(Kind::ones); }
  static ParamInit constant(double value) {
    ParamInit i(Kind::constant);
    i.a_ = value;
    return i;
  }
  static ParamInit normal(double stddev, double mean = 0.0) {
    ParamInit i(Kind::normal);
    i.a_ = mean;
    i.b_ = stddev;
    return i;
  }
  // Uniform on [low, high).
  static ParamInit uniform(double low, double high) {
    ParamInit i(Kind::uniform);
    i.a_ = low;
    i.b_ = high;
    return i;
  }
  // Values from the caller: how pretrained weights are loaded (each rank reads its slice's byte ranges).
  static ParamInit from_reader(Reader reader) {
    ParamInit i(Kind::reader);
    i.reader_ = std::move(reader);
    return i;
  }

  Kind kind() const { return kind_; }
  double value() const { return a_; }   // constant
  double mean() const { return a_; }    // normal
  double stddev() const { return b_; }  // normal
  double low() const { return a_; }     // uniform
  double high() const { return b_; }    // uniform
  const Reader& reader() const { return reader_; }

 private:
  explicit ParamInit(Kind kind) : kind_(kind) {}
  Kind kind_;
  double a_ = 0.0, b_ = 0.0;
  Reader reader_;
};

// One parameter of a unit, as declared.
struct ParamSpec {
  ParamSpec(std::string name_, std::vector<int64_t> shape_, ParamInit init_ = ParamInit::zeros(),
            std::optional<DType> dtype_ = std::nullopt)
      : name(std::move(name_)), shape(std::move(shape_)), init(std::move(init_)), dtype(dtype_) {}

  std::string name;            // unique within the unit, e.g. "wq"; the full name is "<unit>.<name>"
  std::vector<int64_t> shape;  // row-major; every dimension >= 1 (an empty shape is a scalar)
  ParamInit init = ParamInit::zeros();
  // Element type of the compute copy. Default: the config's compute dtype (bf16, f16 or f32). All
  // parameters of a unit share one type: to keep some parameters in another type, give them their own unit.
  std::optional<DType> dtype;
};

// A parameter as the engine holds it.
struct ParamInfo {
  ParamId id;
  UnitId unit;
  std::string name;        // full name: "<unit>.<param>"
  std::string local_name;  // the name within the unit
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // first element in the unit's flat buffer
  DType dtype = DType::f32;
};

// A unit as the engine holds it. Sizes are in elements.
struct UnitInfo {
  UnitId id;
  std::string name;
  std::vector<ParamId> params;
  DType dtype = DType::f32;  // compute dtype of its parameters
  int64_t numel = 0;         // sum of its parameters' numel
  int64_t slice_numel = 0;   // ceil(numel / world_size): the elements each rank owns
  int64_t padded_numel = 0;  // world_size * slice_numel
  bool persistent = false;   // stage 3: stays gathered (stage3_param_persistence_threshold)
};

// Where rank `rank`'s slice of a unit lies in the unit's flat buffer.
struct SliceInfo {
  int rank = 0;
  int64_t offset = 0;  // rank * slice_numel
  int64_t size = 0;    // slice_numel (the padded size every rank holds)
  int64_t valid = 0;   // of which real parameter elements: the rest is padding
};

// The part of one parameter that lies in a slice: elements [param_begin, param_end) of the parameter are
// elements [slice_offset, slice_offset + (param_end - param_begin)) of the slice.
struct ParamSlice {
  ParamId param;
  int64_t param_begin = 0;
  int64_t param_end = 0;
  int64_t slice_offset = 0;
};

}  // namespace zero3
