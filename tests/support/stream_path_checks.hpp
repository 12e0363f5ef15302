// The ordering rules a GPU relies on, checked on what a StreamPathDevice and its StreamPathComm counted during a
// run: each count stays 0 (see StreamPathUsage for what each means).
#pragma once

#include <gtest/gtest.h>

#include "support/stream_path_comm.hpp"
#include "support/stream_path_device.hpp"

namespace zero3::testing {

inline void expect_gpu_ordering_rules(const StreamPathUsage& u, const StreamPathComm& comm) {
  EXPECT_EQ(u.waits_before_record, 0) << "a stream waited on an event that was never recorded";
  EXPECT_EQ(u.syncs_before_record, 0) << "the host waited on an event that was never recorded";
  EXPECT_EQ(u.null_stream_events, 0) << "an event was recorded or waited on the null stream";
  EXPECT_EQ(u.frees_while_queued, 0) << "memory was freed while queued work still used it";
  EXPECT_EQ(u.kernels_on_host_memory, 0) << "a kernel was given host memory";
  EXPECT_EQ(u.wait_cycles, 0) << "two streams waited on each other";
  EXPECT_EQ(u.uses_before_allocation, 0)
      << "a stream used device memory before it was ordered after the memory's allocation on the compute stream";
  EXPECT_EQ(u.legacy_stream_ops, 0) << "work landed on the legacy default stream, not the caller's compute stream";
  EXPECT_EQ(comm.host_memory_collectives(), 0) << "a collective was given host memory (NCCL reads device memory)";
  EXPECT_EQ(comm.legacy_stream_collectives(), 0)
      << "a collective ran on the legacy default stream while the device computes on the caller's stream";
}

}  // namespace zero3::testing
