// Stage 3's persistence decision is logged once by materialize() on rank 0: which units stay gathered for good,
// their elements, and the thresholds that decided it; and a warning when every unit stays gathered on several
// ranks, since stage 3 then holds as many parameters per rank as stage 2.
// zero3-test-ranks: 1 2
#include <gtest/gtest.h>

#include <string>

#include "support/engine_world.hpp"
#include "zero3/engine.hpp"
#include "zero3/log.hpp"

namespace zero3 {
namespace {

using namespace zero3::testing;

// What materialize() wrote to stderr for a model of units of 10, 5000 and 20 elements.
std::string materialize_log(int stage, int64_t threshold, int64_t model_threshold = INT64_MAX) {
  auto comm = engine_world();
  Config c;
  c.zero.stage = stage;
  c.zero.param_persistence_threshold = threshold;
  c.zero.model_persistence_threshold = model_threshold;
  c.train_micro_batch_size_per_gpu = 1;
  Engine engine(resolved_for(c, *comm), comm, cpu_device());
  engine.add_unit("small", {{"w", {10}}});
  engine.add_unit("big", {{"w", {50, 100}}});
  engine.add_unit("norm", {{"w", {20}}});
  log::set_level(LogLevel::info);
  ::testing::internal::CaptureStderr();
  engine.materialize();
  return ::testing::internal::GetCapturedStderr();
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PersistenceLog, NamesTheUnitsKeptAndTheThreshold) {
  const bool rank0 = engine_world()->rank() == 0;
  const std::string log = materialize_log(3, 100);
  if (!rank0) {
    EXPECT_FALSE(has(log, "stage 3:")) << log;
    return;
  }
  EXPECT_TRUE(has(log,
                  "INFO  stage 3: 2 of 3 units stay gathered for good on every rank (30 of 5030 elements): "
                  "'small', 'norm'; kept are units of at most 100 elements (stage3_param_persistence_threshold)\n"))
      << log;
  EXPECT_FALSE(has(log, "WARN")) << log;
}

TEST(PersistenceLog, SaysWhatTheModelThresholdLeftSharded) {
  const std::string log = materialize_log(3, 100, 15);
  if (engine_world()->rank() != 0) return;
  EXPECT_TRUE(has(log,
                  "stage 3: 1 of 3 units stay gathered for good on every rank (10 of 5030 elements): 'small'; "
                  "kept are units of at most 100 elements (stage3_param_persistence_threshold), up to 15 "
                  "elements in all (stage3_model_persistence_threshold); 1 more small unit(s) are sharded past "
                  "that cap\n"))
      << log;
}

TEST(PersistenceLog, SaysWhenNoUnitStays) {
  const std::string log = materialize_log(3, 0);
  if (engine_world()->rank() != 0) return;
  EXPECT_TRUE(has(log,
                  "stage 3: no unit stays gathered, so every unit is gathered for each use (the smallest has 10 "
                  "elements; kept would be units of at most 0 elements (stage3_param_persistence_threshold))\n"))
      << log;
}

TEST(PersistenceLog, WarnsWhenEveryUnitStaysOnSeveralRanks) {
  const std::string log = materialize_log(3, 100'000);
  if (engine_world()->rank() != 0) return;
  EXPECT_TRUE(has(log, "stage 3: 3 of 3 units stay gathered for good")) << log;
  const bool warned = has(log,
                          "WARN  stage 3: every unit stays gathered (the largest has 5000 elements; kept are "
                          "units of at most 100000 elements (stage3_param_persistence_threshold)), so each rank "
                          "holds all 5030 parameters as at stage 2 and stage 3 saves no parameter memory; set "
                          "stage3_param_persistence_threshold below 5000 to shard the larger units\n");
  // One rank holds everything at any stage: nothing to warn about.
  EXPECT_EQ(warned, engine_world()->size() > 1) << log;
}

TEST(PersistenceLog, NothingBelowStage3) { EXPECT_FALSE(has(materialize_log(2, 100'000), "stage 3:")); }

}  // namespace
}  // namespace zero3
