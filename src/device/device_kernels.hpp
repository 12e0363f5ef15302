// The element kernels the engine runs on its Device: conversions, scaled copies and accumulation of
// gradients, the gradient statistics of the step, the Adam update, the initialisation fill and the block
// quantization of quantized collectives.
//
// Each device implements them from the single-source element functions (kernels/elementwise.hpp,
// optim/adam_math.hpp, kernels/philox_init.hpp, kernels/block_quantize.hpp). Buffers are device memory of `n`
// elements of the given types; `stream` orders the work on cuda (nullptr: the device's compute stream,
// Device::default_stream()) and is ignored on cpu, where every call completes before it returns. Calls from
// different threads on disjoint buffers may run at the same time.
//
// The public Device (zero3/device.hpp) does not show them: every device zero3 makes is a DeviceBackend, which
// adds them, and kernels_of() finds them for the engine.
#pragma once

#include <cstdint>

#include "kernels/block_quantize.hpp"
#include "kernels/philox_init.hpp"
#include "optim/adam_math.hpp"
#include "zero3/device.hpp"
#include "zero3/dtype.hpp"

namespace zero3::detail {

// Sum of squares (in double) and the number of Inf/NaN elements of a buffer.
struct GradStats {
  double sum_squares = 0.0;
  int64_t non_finite = 0;
};

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;

  // dst[i] = scale * src[i], converting types; dst and src do not overlap unless they are the same buffer
  // of the same type.
  virtual void scale_copy(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                          Stream stream = nullptr) = 0;

  // dst[i] += scale * src[i] (arithmetic in fp32).
  virtual void scale_add(void* dst, DType dst_type, const void* src, DType src_type, float scale, int64_t n,
                         Stream stream = nullptr) = 0;

  // Blocking: waits for queued work on `stream`. The sum is accumulated in fixed-size chunks, so the
  // result does not depend on the number of threads.
  virtual GradStats grad_stats(const void* x, DType type, int64_t n, Stream stream = nullptr) = 0;

  // The stream-ordered form of grad_stats, for statistics read once at the end: acc (device memory, two
  // doubles) gets acc[0] += the sum of squares grad_stats would return (the same bits), acc[1] += the Inf/NaN
  // count. Queued on `stream`; no host wait.
  virtual void accumulate_grad_stats(const void* x, DType type, int64_t n, double* acc, Stream stream = nullptr) = 0;
  // out (device memory, two floats) = {float(acc[1]), float(acc[0])}, the Inf/NaN count raised to at least 1
  // when the sum of squares overflows float: the statistics as the ranks exchange them. Queued on `stream`.
  virtual void grad_stats_to_f32(const double* acc, float* out, Stream stream = nullptr) = 0;

  // One Adam/AdamW step over n elements (optim/adam_math.hpp), writing the updated p also to `copy_out`
  // (n elements of copy_type) when it is not null.
  virtual void adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepConsts& c, void* copy_out,
                    DType copy_type, Stream stream = nullptr) = 0;

  // out[0, end - begin) = elements [begin, end) of the parameter with stream id `param_stream` (fp32).
  virtual void init_fill(float* out, const FillSpec& spec, uint64_t seed, uint64_t param_stream, int64_t begin,
                         int64_t end, Stream stream = nullptr) = 0;

  // Block quantization (kernels/block_quantize.hpp: the format, the rounding, Inf/NaN and zero blocks).
  // A message is the quantized form of one chunk of `chunk` elements, quant_message_bytes(chunk, f) bytes;
  // the `chunks` chunks lie back to back, and so do their messages. Arguments are checked first
  // (check_quant_args: InvalidArgument); the results are the same bits on every device.
  //
  // dst (messages) <- src (chunks of src_type). qwZ: a rank's slice becomes one message for the all-gather;
  // qgZ: a bucket becomes one message per destination of an all-to-all.
  virtual void quantize(void* dst, const void* src, DType src_type, int64_t chunk, int64_t chunks, const QuantFormat& f,
                        Stream stream = nullptr) = 0;
  // dst (chunks of dst_type) <- src (messages). qwZ: every rank's message into the unit's full buffer.
  virtual void dequantize(void* dst, DType dst_type, const void* src, int64_t chunk, int64_t chunks,
                          const QuantFormat& f, Stream stream = nullptr) = 0;
  // dst (one chunk of fp32) = the sum of the dequantized messages, added in message order from +0. qgZ:
  // the chunks an all-to-all delivered, reduced in fp32 before the next stage quantizes them again.
  virtual void dequantize_sum(float* dst, const void* src, int64_t chunk, int64_t chunks, const QuantFormat& f,
                              Stream stream = nullptr) = 0;
};

// A Device zero3 implements: the public interface plus the engine's element kernels.
class DeviceBackend : public Device {
 public:
  virtual DeviceKernels& kernels() = 0;
};

// The element kernels of `device`. Throws InvalidArgument naming the device when it is not a DeviceBackend
// (a Device implemented outside zero3).
DeviceKernels& kernels_of(Device& device);

}  // namespace zero3::detail
