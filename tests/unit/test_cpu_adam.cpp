// CPU Adam: the AVX-512 and AVX2 paths against the scalar reference, bit for bit, over odd sizes (vector
// bodies plus tails, one thread and several), Adam and AdamW, with and without bias correction, and the
// 16-bit copies against the reference conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "offload/cpu_adam.hpp"
#include "zero3/error.hpp"

using namespace zero3;

namespace {

struct State {
  std::vector<float> p, g, m, v;
};

State random_state(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1e-2f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng) * 0.05f;
    s.g[i] = normal(rng) * (i % 7 == 0 ? 1e-4f : 1.0f);
    s.m[i] = normal(rng) * 1e-2f;
    s.v[i] = uni(rng) * uni(rng);
  }
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, size_t* first) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (f32_bits(a[i]) != f32_bits(b[i])) {
      *first = i;
      return false;
    }
  }
  return true;
}

std::vector<CpuIsa> vector_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// Runs `steps` steps on a copy of `init` with the given ISA and returns the final state and last copy.
State run_steps(const State& init, const AdamHyper& h, int steps, CpuIsa isa, DType copy_dtype,
                std::vector<uint8_t>* copy, int threads = 1) {
  State s = init;
  copy->assign(s.p.size() * dtype_size(copy_dtype), 0xee);
  for (int step = 1; step <= steps; ++step) {
    cpu_adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), s.p.size(), adam_step_consts(h, step), copy->data(),
                  copy_dtype, isa, threads);
  }
  return s;
}

}  // namespace

TEST(CpuAdam, IsaDetection) {
  EXPECT_TRUE(cpu_isa_supported(CpuIsa::scalar));
  EXPECT_TRUE(cpu_isa_supported(cpu_isa_detect()));
  EXPECT_NE(cpu_isa_detect(), CpuIsa::best);
  std::printf("cpu_adam best ISA on this CPU: %s\n", std::string(cpu_isa_name(cpu_isa_detect())).c_str());
}

TEST(CpuAdam, ScalarIsTheReferenceUpdate) {
  State s = random_state(1001, 7);
  State ref = s;
  AdamHyper h{.lr = 3e-3f, .weight_decay = 0.1f};
  AdamStepConsts c = adam_step_consts(h, 3);
  std::vector<uint16_t> copy(s.p.size());
  cpu_adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), s.p.size(), c, copy.data(), DType::bf16,
                CpuIsa::scalar);
  for (size_t i = 0; i < ref.p.size(); ++i) {
    adam_update(ref.p[i], ref.g[i], ref.m[i], ref.v[i], c);
    ASSERT_EQ(f32_bits(s.p[i]), f32_bits(ref.p[i])) << i;
    ASSERT_EQ(f32_bits(s.m[i]), f32_bits(ref.m[i])) << i;
    ASSERT_EQ(f32_bits(s.v[i]), f32_bits(ref.v[i])) << i;
    ASSERT_EQ(copy[i], f32_to_bf16(ref.p[i])) << i;
  }
}

TEST(CpuAdam, VectorPathsMatchScalarBitForBit) {
  if (vector_isas().empty()) GTEST_SKIP() << "no AVX2 or AVX-512 on this CPU";
  const size_t sizes[] = {1, 15, 17, 1000003};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  for (size_t n : sizes) {
    State init = random_state(n, static_cast<uint32_t>(n));
    for (bool adamw : {true, false}) {
      for (bool bias_correction : {true, false}) {
        AdamHyper h{.lr = 1e-2f, .weight_decay = 0.01f, .adam_w_mode = adamw, .bias_correction = bias_correction};
        for (DType dt : dtypes) {
          std::vector<uint8_t> ref_copy;
          State ref = run_steps(init, h, 3, CpuIsa::scalar, dt, &ref_copy);
          // The last copy is the reference conversion of the final p.
          for (size_t i = 0; i < n; ++i) {
            uint16_t want16 = dt == DType::bf16 ? f32_to_bf16(ref.p[i]) : f32_to_f16(ref.p[i]);
            if (dt == DType::f32) {
              float got;
              std::memcpy(&got, ref_copy.data() + 4 * i, 4);
              ASSERT_EQ(f32_bits(got), f32_bits(ref.p[i]));
            } else {
              uint16_t got;
              std::memcpy(&got, ref_copy.data() + 2 * i, 2);
              ASSERT_EQ(got, want16) << "n=" << n << " i=" << i;
            }
          }
          for (CpuIsa isa : vector_isas()) {
            for (int threads : {1, 2, 3}) {
              std::vector<uint8_t> copy;
              State got = run_steps(init, h, 3, isa, dt, &copy, threads);
              SCOPED_TRACE(::testing::Message()
                           << cpu_isa_name(isa) << " n=" << n << " adamw=" << adamw << " bc=" << bias_correction
                           << " copy=" << dtype_name(dt) << " threads=" << threads);
              size_t i = 0;
              ASSERT_TRUE(same_bits(got.p, ref.p, &i)) << "p differs at " << i;
              ASSERT_TRUE(same_bits(got.m, ref.m, &i)) << "m differs at " << i;
              ASSERT_TRUE(same_bits(got.v, ref.v, &i)) << "v differs at " << i;
              ASSERT_EQ(copy, ref_copy);
            }
          }
        }
      }
    }
  }
}

// With lr = 0, g = m = v = 0 and no weight decay, p is unchanged and the copy is the plain conversion of p:
// this drives every interesting bit pattern through the vector conversions (ties, subnormals, overflow to
// Inf, NaNs of both signs) and compares with the reference conversions.
TEST(CpuAdam, CopiesAreTheReferenceConversion) {
  std::vector<float> values;
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u,
                               0x33000000u, 0x33000001u, 0x337fffffu, 0x387fc000u, 0x387fe000u, 0x38800000u,
                               0x3f808000u, 0x3f818000u, 0x3f808001u, 0x477fe000u, 0x477fefffu, 0x477ff000u,
                               0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                               0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0xff812345u};
  for (uint32_t b : specials) values.push_back(f32_from_bits(b));
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) values.push_back(f32_from_bits(rng()));
  // Every f16 rounding boundary region around 1.0 and in the subnormal range.
  for (uint32_t b = 0x3f800000u; b < 0x3f800000u + 0x4000u; ++b) values.push_back(f32_from_bits(b));
  for (uint32_t b = 0x33000000u; b < 0x38800000u; b += 0x1001u) values.push_back(f32_from_bits(b));
  size_t n = values.size();
  AdamHyper h{.lr = 0.0f, .weight_decay = 0.0f};
  AdamStepConsts c = adam_step_consts(h, 1);
  for (DType dt : {DType::bf16, DType::f16}) {
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_isa_supported(isa)) continue;
      std::vector<float> p = values, g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
      std::vector<uint16_t> copy(n);
      cpu_adam_step(p.data(), g.data(), m.data(), v.data(), n, c, copy.data(), dt, isa);
      for (size_t i = 0; i < n; ++i) {
        // adam_update leaves finite p unchanged here (Inf becomes NaN through 0*Inf in the step).
        uint16_t want = dt == DType::bf16 ? f32_to_bf16(p[i]) : f32_to_f16(p[i]);
        ASSERT_EQ(copy[i], want) << cpu_isa_name(isa) << " " << dtype_name(dt) << " input bits 0x" << std::hex
                                 << f32_bits(values[i]) << " after step 0x" << f32_bits(p[i]);
        if (std::isfinite(values[i])) {
          ASSERT_EQ(f32_bits(p[i]), f32_bits(values[i]));
        }
      }
    }
  }
}

TEST(CpuAdam, UnsupportedIsaIsAnError) {
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_isa_supported(isa)) continue;
    float x = 0;
    EXPECT_THROW(cpu_adam_step(&x, &x, &x, &x, 1, adam_step_consts(AdamHyper{}, 1), nullptr, DType::f32, isa),
                 Unsupported);
  }
}

TEST(CpuAdam, NegativeThreadCountIsAnError) {
  float x = 0;
  EXPECT_THROW(
      cpu_adam_step(&x, &x, &x, &x, 1, adam_step_consts(AdamHyper{}, 1), nullptr, DType::f32, CpuIsa::scalar, -1),
      InvalidArgument);
}

TEST(CpuAdam, ZeroLengthIsANoOp) {
  cpu_adam_step(nullptr, nullptr, nullptr, nullptr, 0, adam_step_consts(AdamHyper{}, 1));
}
