#include "ops/rope.hpp"

#include <cmath>
#include <string>

#include "ops/parallel.hpp"
#include "zero3/error.hpp"

namespace llama3 {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t dim = c.head_dim, half = dim / 2;
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  if (!c.rope_scaling) return inv;
  // Llama-3.1: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated. The
  // float32 steps follow transformers' _compute_llama3_parameters, where `scalar / tensor` is evaluated as
  // reciprocal(tensor) * scalar.
  const RopeScaling& s = *c.rope_scaling;
  const float factor = static_cast<float>(s.factor);
  const float low = static_cast<float>(s.low_freq_factor);
  const float band = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  const float old_len = static_cast<float>(s.original_max_position_embeddings);
  const float low_freq_wavelen =
      static_cast<float>(static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor);
  const float high_freq_wavelen =
      static_cast<float>(static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * M_PI);
  for (int64_t i = 0; i < half; ++i) {
    float wavelen = (1.0f / inv[i]) * two_pi;
    float scaled = wavelen > low_freq_wavelen ? inv[i] / factor : inv[i];
    bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      float smooth = ((1.0f / wavelen) * old_len - low) / band;
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    inv[i] = scaled;
  }
  return inv;
}

template <typename T>
RopeTable<T> make_rope_table(const std::vector<float>& inv_freq, const int32_t* positions, int64_t n_tokens) {
  RopeTable<T> t;
  t.n_tokens = n_tokens;
  t.half = static_cast<int64_t>(inv_freq.size());
  t.cos.resize(static_cast<size_t>(n_tokens * t.half));
  t.sin.resize(static_cast<size_t>(n_tokens * t.half));
  for (int64_t r = 0; r < n_tokens; ++r) {
    if (positions[r] < 0) {
      throw zero3::InvalidArgument("positions[" + std::to_string(r) + "] = " + std::to_string(positions[r]) +
                                   ": positions must be >= 0");
    }
  }
#pragma omp parallel for schedule(static) if (n_tokens * t.half >= kParallelMinWork)
  for (int64_t r = 0; r < n_tokens; ++r) {
    for (int64_t i = 0; i < t.half; ++i) {
      float angle = static_cast<float>(positions[r]) * inv_freq[i];
      t.cos[r * t.half + i] = static_cast<T>(std::cos(static_cast<double>(angle)));
      t.sin[r * t.half + i] = static_cast<T>(std::sin(static_cast<double>(angle)));
    }
  }
  return t;
}

template <typename T>
void rope_forward(T* x, int64_t ld, int64_t n_heads, int64_t head_dim, const RopeTable<T>& t) {
#pragma omp parallel for schedule(static) if (t.n_tokens * n_heads * head_dim >= kParallelMinWork)
  for (int64_t r = 0; r < t.n_tokens; ++r)
    for (int64_t h = 0; h < n_heads; ++h)
      rope_forward_head(x + r * ld + h * head_dim, t.cos.data() + r * t.half, t.sin.data() + r * t.half, t.half);
}

template <typename T>
void rope_backward(T* dx, int64_t ld, int64_t n_heads, int64_t head_dim, const RopeTable<T>& t) {
#pragma omp parallel for schedule(static) if (t.n_tokens * n_heads * head_dim >= kParallelMinWork)
  for (int64_t r = 0; r < t.n_tokens; ++r)
    for (int64_t h = 0; h < n_heads; ++h)
      rope_backward_head(dx + r * ld + h * head_dim, t.cos.data() + r * t.half, t.sin.data() + r * t.half, t.half);
}

template RopeTable<float> make_rope_table<float>(const std::vector<float>&, const int32_t*, int64_t);
template RopeTable<double> make_rope_table<double>(const std::vector<float>&, const int32_t*, int64_t);
template void rope_forward<float>(float*, int64_t, int64_t, int64_t, const RopeTable<float>&);
template void rope_forward<double>(double*, int64_t, int64_t, int64_t, const RopeTable<double>&);
template void rope_backward<float>(float*, int64_t, int64_t, int64_t, const RopeTable<float>&);
template void rope_backward<double>(double*, int64_t, int64_t, int64_t, const RopeTable<double>&);

}  // namespace llama3
