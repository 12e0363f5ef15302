// main() of every test program. GoogleTest's, plus a rank-aware banner under `zero3 launch`.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
