// The stage-3 schedule as pure logic: recording, following the trace, prefetch within the bucket and the
// live cap, reuse distance, and what happens when a micro-step leaves the recorded order.
#include <gtest/gtest.h>

#include "zero/schedule.hpp"

using namespace zero3;
using namespace zero3::detail;

namespace {

ScheduleEvent F(int u) { return {UnitId{u}, Phase::forward}; }
ScheduleEvent B(int u) { return {UnitId{u}, Phase::backward}; }

// Units 0-3 of 100 elements, unit 4 of 10 elements and persistent.
Schedule make(int64_t prefetch, int64_t live, int64_t reuse) {
  return Schedule({prefetch, live, reuse}, {100, 100, 100, 100, 10}, {false, false, false, false, true});
}

const std::vector<ScheduleEvent> kOrder = {F(0), F(4), F(1), F(2), F(3), B(3), B(2), B(1), B(4), B(0)};

void record_all(Schedule& s) {
  for (auto e : kOrder) s.record(e);
}

std::vector<int> ids(const std::vector<UnitId>& v) {
  std::vector<int> out;
  for (UnitId u : v) out.push_back(u.index);
  return out;
}

auto all_gatherable = [](UnitId) { return true; };

}  // namespace

TEST(Schedule, FirstMicroStepRecordsAndCannotLookAhead) {
  Schedule s = make(1000, 1000, 1000);
  EXPECT_FALSE(s.has_trace());
  s.record(F(0));
  EXPECT_TRUE(s.plan_prefetch(0, 0, all_gatherable).empty());
  EXPECT_FALSE(s.keep_for_reuse(UnitId{0}));
  EXPECT_EQ(s.next_use(UnitId{0}), -1);
  for (size_t i = 1; i < kOrder.size(); ++i) s.record(kOrder[i]);
  EXPECT_TRUE(s.finish_micro_step());
  EXPECT_EQ(s.trace(), kOrder);
  record_all(s);
  EXPECT_FALSE(s.finish_micro_step()) << "the same order again is no change";
}

TEST(Schedule, PrefetchStaysWithinTheBucketAndTheLiveCap) {
  Schedule s = make(250, 1000, 0);
  record_all(s);
  s.finish_micro_step();
  s.record(F(0));
  // Ahead: unit 4 is persistent (skipped); 1 and 2 fit 250; 3 would make 300.
  EXPECT_EQ(ids(s.plan_prefetch(0, 100, all_gatherable)), (std::vector<int>{1, 2}));
  // 150 elements already ahead: only one more unit fits.
  EXPECT_EQ(ids(s.plan_prefetch(150, 100, all_gatherable)), (std::vector<int>{1}));
  // The live cap binds first.
  Schedule capped = make(1000, 250, 0);
  record_all(capped);
  capped.finish_micro_step();
  capped.record(F(0));
  EXPECT_EQ(ids(capped.plan_prefetch(0, 100, all_gatherable)), (std::vector<int>{1}));
  // A unit larger than the bucket is still fetched when nothing is ahead yet; a bucket of 0 turns prefetch off.
  Schedule small_bucket = make(50, 1000, 0);
  record_all(small_bucket);
  small_bucket.finish_micro_step();
  small_bucket.record(F(0));
  EXPECT_EQ(ids(small_bucket.plan_prefetch(0, 100, all_gatherable)), (std::vector<int>{1}));
  EXPECT_TRUE(small_bucket.plan_prefetch(10, 100, all_gatherable).empty());
  Schedule off = make(0, 1000, 0);
  record_all(off);
  off.finish_micro_step();
  off.record(F(0));
  EXPECT_TRUE(off.plan_prefetch(0, 100, all_gatherable).empty());
  // Units already gathered are skipped, not counted.
  EXPECT_EQ(ids(s.plan_prefetch(0, 100, [](UnitId u) { return u.index != 1; })), (std::vector<int>{2, 3}));
}

TEST(Schedule, ReuseDistanceCountsTheElementsBetween) {
  // After F(3) closes, its next use B(3) is the very next entry: distance 0.
  Schedule s = make(0, 1000, 0);
  record_all(s);
  s.finish_micro_step();
  for (int i = 0; i < 5; ++i) s.record(kOrder[static_cast<size_t>(i)]);
  EXPECT_TRUE(s.keep_for_reuse(UnitId{3}));
  EXPECT_EQ(s.next_use(UnitId{3}), 5);
  // F(2) is next used at B(2), position 6; between: B(3) (100 elements).
  EXPECT_FALSE(s.keep_for_reuse(UnitId{2}));
  Schedule wide = make(0, 1000, 100);
  record_all(wide);
  wide.finish_micro_step();
  for (int i = 0; i < 5; ++i) wide.record(kOrder[static_cast<size_t>(i)]);
  EXPECT_TRUE(wide.keep_for_reuse(UnitId{2}));
  EXPECT_FALSE(wide.keep_for_reuse(UnitId{1})) << "B(3) and B(2): 200 elements";
  // Nothing comes after the last use.
  for (size_t i = 5; i < kOrder.size(); ++i) wide.record(kOrder[i]);
  EXPECT_FALSE(wide.keep_for_reuse(UnitId{0}));
}

TEST(Schedule, LeavingTheTraceStopsLookAheadAndRecordsTheNewOrder) {
  Schedule s = make(1000, 1000, 1000);
  record_all(s);
  s.finish_micro_step();
  s.record(F(0));
  EXPECT_TRUE(s.following());
  s.record(F(2));  // the trace says F(4)
  EXPECT_FALSE(s.following());
  EXPECT_TRUE(s.plan_prefetch(0, 0, all_gatherable).empty());
  EXPECT_FALSE(s.keep_for_reuse(UnitId{2}));
  s.record(B(2));
  s.record(B(0));
  EXPECT_TRUE(s.finish_micro_step());
  EXPECT_EQ(s.trace(), (std::vector<ScheduleEvent>{F(0), F(2), B(2), B(0)}));
  EXPECT_TRUE(s.has_trace());
  s.record(F(0));
  EXPECT_TRUE(s.following());
}

// NVMe parameter reads ahead: the next distinct non-persistent units in trace order that need a read, at most
// `count`; from the trace's start between micro-steps; nothing before a trace exists or off the trace.
TEST(Schedule, ReadsPlanTheNextUnitsThatNeedThem) {
  Schedule s = make(100, 1000, 0);
  auto all = [](UnitId) { return true; };
  EXPECT_TRUE(s.plan_reads(4, all).empty()) << "no trace yet";
  record_all(s);
  s.finish_micro_step();
  // Between micro-steps: from the trace's start, skipping persistent unit 4.
  EXPECT_EQ(ids(s.plan_reads(2, all)), (std::vector<int>{0, 1}));
  s.record(F(0));
  s.record(F(4));
  s.record(F(1));
  // After F1: F2, F3, then B3 and B2 are uses of units already listed, then B1 and B0.
  EXPECT_EQ(ids(s.plan_reads(10, all)), (std::vector<int>{2, 3, 1, 0}));
  // A unit that needs no read (gathered until its next use) is passed over, and only its next use counts.
  EXPECT_EQ(ids(s.plan_reads(10, [](UnitId u) { return u.index != 2; })), (std::vector<int>{3, 1, 0}));
  EXPECT_EQ(ids(s.plan_reads(1, [](UnitId u) { return u.index != 2; })), (std::vector<int>{3}));
  EXPECT_TRUE(s.plan_reads(0, all).empty());
  // Off the trace: nothing.
  s.record(F(0));
  EXPECT_TRUE(s.plan_reads(10, all).empty());
}
