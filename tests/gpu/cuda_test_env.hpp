// The start of every tests/gpu/test_cuda_* program: with a CUDA device the tests run; without one the
// program first checks that zero3 says so clearly (make_device("cuda") throws CudaError naming CUDA's
// reason, "auto" falls back to cpu), then prints the reason and exits 77, which ctest reports as skipped.
// A wrong answer in that check is a failure (exit 1), so the no-GPU path is tested on every CI run.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "zero3/build_config.hpp"
#include "zero3/device.hpp"
#include "zero3/error.hpp"

#if ZERO3_HAVE_CUDA
#include "device/cuda/cuda_device.hpp"
#endif

namespace zero3::testing_gpu {

[[noreturn]] inline void skip(const std::string& why) {
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

[[noreturn]] inline void fail(const std::string& why) {
  std::printf("FAILED: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(1);
}

// Checks what a GPU-less machine must see, then skips.
[[noreturn]] inline void check_no_device_and_skip(const std::string& why) {
  try {
    auto d = make_device("cuda");
    fail("make_device(\"cuda\") returned a device although CUDA reports none (" + why + ")");
  } catch (const CudaError& e) {
    std::string m = e.what();
    if (m.find("cuda:0: no CUDA device") == std::string::npos || m.find(why) == std::string::npos) {
      fail("make_device(\"cuda\") threw \"" + m + "\"; expected \"cuda:0: no CUDA device: " + why + "\"");
    }
  } catch (const std::exception& e) {
    fail(std::string("make_device(\"cuda\") threw a ") + typeid(e).name() + " (" + e.what() + "), not CudaError");
  }
  auto fallback = make_device("auto");
  if (fallback->type() != DeviceType::cpu) fail("make_device(\"auto\") did not fall back to cpu without a GPU");
  skip("no CUDA device: " + why);
}

class CudaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
#if ZERO3_HAVE_CUDA
    std::string why;
    if (detail::cuda_device_count(&why) == 0) check_no_device_and_skip(why);
#else
    skip("this build of zero3 has no CUDA backend (ZERO3_CUDA off or not found)");
#endif
  }
};

inline const ::testing::Environment* const kCudaEnvironment = ::testing::AddGlobalTestEnvironment(new CudaEnvironment);

}  // namespace zero3::testing_gpu
