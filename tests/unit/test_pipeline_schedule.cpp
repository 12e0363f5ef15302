// The pipeline schedules as data (zero3/pipeline_schedule.hpp): printed, validated by running the ranks' lists
// against each other, their bubbles, schedules broken on purpose, and the shapes a schedule refuses.
// zero3-test-labels: pipeline
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>

#include "zero3/error.hpp"
#include "zero3/pipeline_schedule.hpp"

namespace zero3::pipeline {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PipelineSchedule, OneFOneBOnTwoRanksPrintsAsExpected) {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 4);
  const std::string printed = format_schedule(s);
  std::printf("%s", printed.c_str());
  EXPECT_EQ(printed,
            "1f1b: 2 ranks x 1 stage per rank, 4 micro-batches\n"
            "rank 0: F0 [>a0] F1 [>a1 <g0] B0 F2 [>a2 <g1] B1 F3 [>a3 <g2] B2 [<g3] B3\n"
            "rank 1: [<a0] F0 B0 [>g0 <a1] F1 B1 [>g1 <a2] F2 B2 [>g2 <a3] F3 B3 [>g3]\n");
}

TEST(PipelineSchedule, GPipeOnTwoRanksPrintsAsExpected) {
  const Schedule s = make_schedule(ScheduleKind::gpipe, 2, 3);
  const std::string printed = format_schedule(s);
  std::printf("%s", printed.c_str());
  EXPECT_EQ(printed,
            "gpipe: 2 ranks x 1 stage per rank, 3 micro-batches\n"
            "rank 0: F0 [>a0] F1 [>a1] F2 [>a2 <g0] B0 [<g1] B1 [<g2] B2\n"
            "rank 1: [<a0] F0 [<a1] F1 [<a2] F2 B0 [>g0] B1 [>g1] B2 [>g2]\n");
}

TEST(PipelineSchedule, InterleavedPrintsStagesAndClosesTheRing) {
  const Schedule s = make_schedule(ScheduleKind::interleaved_1f1b, 2, 4, 2);
  const std::string printed = format_schedule(s);
  std::printf("%s", printed.c_str());
  EXPECT_NE(printed.find("interleaved_1f1b: 2 ranks x 2 stages per rank, 4 micro-batches\n"), std::string::npos);
  // Rank 0 holds stages 0 and 2, rank 1 stages 1 and 3; stage 1's activations go back to rank 0's stage 2.
  EXPECT_NE(printed.find("rank 0: F0.0 [>a0.0"), std::string::npos) << printed;
  EXPECT_NE(printed.find("<a0.2"), std::string::npos) << printed;
  EXPECT_NE(printed.find(">a0.1"), std::string::npos) << printed;
  for (int r = 0; r < 2; ++r) {
    int forwards = 0, backwards = 0;
    for (const Action& a : s.actions[static_cast<size_t>(r)]) {
      forwards += a.kind == ActionKind::forward;
      backwards += a.kind == ActionKind::backward;
      if (a.is_transfer()) {
        EXPECT_NE(a.peer_rank, r);
      }
    }
    EXPECT_EQ(forwards, 8);
    EXPECT_EQ(backwards, 8);
  }
}

// Every schedule for a range of shapes validates, and its bubble falls as micro-batches grow; 1F1B's bubble equals
// GPipe's (same steps, less memory) and the interleaved one is smaller.
TEST(PipelineSchedule, EveryShapeValidatesAndTheBubblesAreOrdered) {
  for (int ranks : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", micro-batches " + std::to_string(m));
      const Schedule g = make_schedule(ScheduleKind::gpipe, ranks, m);
      EXPECT_NO_THROW(validate_schedule(g));
      if (m < ranks) continue;
      const Schedule f = make_schedule(ScheduleKind::one_f_one_b, ranks, m);
      EXPECT_NO_THROW(validate_schedule(f));
      EXPECT_NEAR(bubble_fraction(f), bubble_fraction(g), 1e-12);
      // (p - 1) idle steps of each direction per rank out of m + p - 1 steps: GPipe's textbook bubble.
      EXPECT_NEAR(bubble_fraction(g), static_cast<double>(ranks - 1) / (m + ranks - 1), 1e-12);
      if (ranks < 2 || m % ranks != 0) continue;
      for (int v : {2, 3, 4}) {
        SCOPED_TRACE("virtual stages " + std::to_string(v));
        const Schedule i = make_schedule(ScheduleKind::interleaved_1f1b, ranks, m, v);
        EXPECT_NO_THROW(validate_schedule(i));
        EXPECT_LT(bubble_fraction(i), bubble_fraction(f));
      }
    }
  }
  EXPECT_EQ(bubble_fraction(make_schedule(ScheduleKind::one_f_one_b, 1, 4)), 0.0);
}

TEST(PipelineSchedule, TransferTagsNameWhatMoves) {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 4);
  const Action& send = s.actions[0][1];  // >a0
  ASSERT_EQ(send.kind, ActionKind::send_activation);
  const Action& recv = s.actions[1][0];  // <a0
  ASSERT_EQ(recv.kind, ActionKind::recv_activation);
  EXPECT_EQ(transfer_tag(send), transfer_tag(recv));
  Action grad = send;
  grad.kind = ActionKind::send_gradient;
  EXPECT_NE(transfer_tag(grad), transfer_tag(send));
  Action other = send;
  other.micro_batch = 1;
  EXPECT_NE(transfer_tag(other), transfer_tag(send));
}

// Schedules broken on purpose: each names the rank, the action and the rule.
TEST(PipelineSchedule, BrokenSchedulesAreNamed) {
  const Schedule good = make_schedule(ScheduleKind::one_f_one_b, 2, 4);

  Schedule split = good;  // 1F1B with every transfer in a call of its own: both ranks send first and wait
  for (auto& list : split.actions) {
    for (Action& a : list) a.joins_previous = false;
  }
  EXPECT_NE(error_of([&] { validate_schedule(split); })
                .find("1f1b schedule deadlocks: every rank waits for another: "
                      "rank 0 at action 3 (send of the activation of "
                      "micro-batch 1 on stage 0 to rank 1); rank 1 at action 3 "
                      "(send of the gradient of micro-batch 0 on stage 1 to "
                      "rank 0)"),
            std::string::npos)
      << error_of([&] { validate_schedule(split); });

  Schedule backward_first = good;  // rank 1: B0 before F0
  std::swap(backward_first.actions[1][1], backward_first.actions[1][2]);
  EXPECT_EQ(error_of([&] { validate_schedule(backward_first); }),
            "1f1b schedule, rank 1, action 1: backward of micro-batch 0 on stage 1 comes before its forward");

  Schedule no_recv = good;  // rank 1 forgets to receive micro-batch 0's activation
  no_recv.actions[1].erase(no_recv.actions[1].begin());
  EXPECT_EQ(error_of([&] { validate_schedule(no_recv); }),
            "1f1b schedule, rank 1, action 0: forward of micro-batch 0 on stage 1 comes before its input activation "
            "was received");

  Schedule wrong_order = good;  // rank 0 sends micro-batch 1 before micro-batch 0
  wrong_order.actions[0][1].micro_batch = 1;
  wrong_order.actions[0][3].micro_batch = 0;
  EXPECT_NE(error_of([&] { validate_schedule(wrong_order); })
                .find("rank 0, action 1: send of the activation of "
                      "micro-batch 1 on stage 0 to rank 1 comes before "
                      "its forward"),
            std::string::npos);

  Schedule missing_backward = good;
  missing_backward.actions[0].pop_back();  // B3
  EXPECT_EQ(error_of([&] { validate_schedule(missing_backward); }),
            "1f1b schedule, rank 0, action 15: micro-batch 3 on stage 0 has no backward");
}

TEST(PipelineSchedule, ShapesASchedulesRefusesAreNamedWithTheirKeys) {
  EXPECT_EQ(error_of([] { make_schedule(ScheduleKind::interleaved_1f1b, 4, 6, 2); }),
            "gradient_accumulation_steps: schedule interleaved_1f1b needs the micro-batches to be a multiple of "
            "pipeline.stages, got 6 micro-batches over 4 stages (2 left over)");
  EXPECT_EQ(error_of([] { make_schedule(ScheduleKind::one_f_one_b, 4, 3); }),
            "gradient_accumulation_steps: schedule 1f1b needs at least as many micro-batches as pipeline.stages, got "
            "3 micro-batches for 4 stages");
  EXPECT_EQ(error_of([] { make_schedule(ScheduleKind::interleaved_1f1b, 4, 8, 1); }),
            "zero3.pipeline_virtual_stages: 1 for schedule interleaved_1f1b; the interleaved schedule needs at least "
            "2 stages per rank (use 1f1b for 1)");
  EXPECT_EQ(error_of([] { make_schedule(ScheduleKind::gpipe, 2, 4, 2); }),
            "zero3.pipeline_virtual_stages: 2 for schedule gpipe; only interleaved_1f1b runs several stages per rank");
  EXPECT_EQ(error_of([] { make_schedule(ScheduleKind::gpipe, 0, 4); }),
            "pipeline.stages: 0 pipeline ranks; expected at least 1");
  EXPECT_EQ(error_of([] { make_schedule(ScheduleKind::gpipe, 2, 0); }),
            "gradient_accumulation_steps: 0 micro-batches; the pipeline needs at least 1");
  EXPECT_THROW(make_schedule(ScheduleKind::gpipe, 2, 0), ConfigError);
  EXPECT_EQ(error_of([] { parse_schedule("zb", "zero3.pipeline_schedule"); }),
            "zero3.pipeline_schedule: unknown pipeline schedule \"zb\"; expected gpipe, 1f1b or interleaved_1f1b");
  EXPECT_EQ(parse_schedule("1f1b", "k"), ScheduleKind::one_f_one_b);
}

}  // namespace
}  // namespace zero3::pipeline
