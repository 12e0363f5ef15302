// The bytes the engine's collectives send, per rank, split by whether they stay on the node or cross to another.
//
// The model of a collective is a ring, as NCCL's and Gloo's are: over a group of g ranks, in the group's rank
// order, each rank sends only to the next rank of the group, and per collective it sends
//   all_gather of n elements per rank:      (g - 1) * n elements
//   reduce_scatter of n elements per rank:  (g - 1) * n
//   all_reduce of n elements:               floor(2 (g - 1) n / g)
// times the element size of the dtype on the wire. The bytes count as inter-node when the next rank of the group
// lies on another node, else as intra-node; summed over a node's ranks, the inter-node bytes are what the node's
// link carries (up to the transports' framing). A collective counts as inter-node when its group spans nodes.
// The engine counts its parameter gathers and gradient reductions this way (ScheduleStats::gather_traffic,
// ScheduleStats::reduce_traffic); the small collectives that check and agree (orders, Inf/NaN, norms) are not
// counted.
#pragma once

#include <cstdint>

namespace zero3 {

struct CollectiveTraffic {
  int64_t collectives = 0;             // issued by this rank
  int64_t inter_node_collectives = 0;  // of which over a group that spans nodes
  int64_t intra_node_bytes = 0;        // sent to the next rank of a group on this rank's node
  int64_t inter_node_bytes = 0;        // sent to the next rank of a group on another node

  CollectiveTraffic& operator+=(const CollectiveTraffic& o) {
    collectives += o.collectives;
    inter_node_collectives += o.inter_node_collectives;
    intra_node_bytes += o.intra_node_bytes;
    inter_node_bytes += o.inter_node_bytes;
    return *this;
  }
  friend CollectiveTraffic operator-(CollectiveTraffic a, const CollectiveTraffic& b) {
    a.collectives -= b.collectives;
    a.inter_node_collectives -= b.inter_node_collectives;
    a.intra_node_bytes -= b.intra_node_bytes;
    a.inter_node_bytes -= b.inter_node_bytes;
    return a;
  }
  friend bool operator==(const CollectiveTraffic&, const CollectiveTraffic&) = default;
};

}  // namespace zero3
