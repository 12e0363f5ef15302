#include "comm/collective_args.hpp"

#include <cstdint>
#include <map>

#include "zero3/error.hpp"

namespace zero3::comm {
namespace {

std::string call_text(const char* collective, size_t count, DType dtype, const char* op_name, int root) {
  std::string s =
      std::string(collective) + "(count=" + std::to_string(count) + ", dtype=" + std::string(dtype_name(dtype));
  if (op_name) s += std::string(", op=") + op_name;
  if (root >= 0) s += ", root=" + std::to_string(root);
  return s + ")";
}

}  // namespace

std::string describe_collective(const char* collective, size_t count, DType dtype, int rank, int size,
                                const char* op_name, int root) {
  return call_text(collective, count, dtype, op_name, root) + " on rank " + std::to_string(rank) + " of " +
         std::to_string(size);
}

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_gather_into:
      return "all_gather_into";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::all_to_all:
      return "all_to_all";
  }
  return "an unknown collective";
}

std::string describe_call(const CollectiveCall& call) {
  if (call.kind == CollectiveKind::barrier) return "barrier()";
  const char* op = call.op >= 0 ? reduce_op_name(static_cast<ReduceOp>(call.op)) : nullptr;
  return call_text(collective_name(call.kind), call.count, call.dtype, op, call.root);
}

std::string mismatch_message(const std::string& what, uint64_t number, const std::vector<CollectiveCall>& by_rank) {
  std::map<std::string, std::vector<int>> groups;  // call text -> ranks, in rank order
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    std::string text = describe_call(by_rank[r]);
    if (!groups.count(text)) order.push_back(text);
    groups[text].push_back(static_cast<int>(r));
  }
  std::string detail;
  for (const std::string& text : order) {
    const std::vector<int>& ranks = groups[text];
    std::string list;
    for (size_t i = 0; i < ranks.size(); ++i) list += (i ? ", " : "") + std::to_string(ranks[i]);
    detail +=
        (detail.empty() ? "" : "; ") + std::string(ranks.size() == 1 ? "rank " : "ranks ") + list + " called " + text;
  }
  return what + ": the ranks called different collectives as call #" + std::to_string(number) +
         " of this communicator: " + detail +
         ". Every rank must call the same collectives in the same order; no data was sent, and the communicator "
         "remains usable";
}

void require_buffer(const void* buf, const char* buffer_name, size_t count, const std::string& what) {
  if (count > 0 && buf == nullptr) {
    throw InvalidArgument(what + ": `" + buffer_name + "` is null but count is " + std::to_string(count));
  }
}

void require_sum_or_avg(ReduceOp op, const std::string& what) {
  if (op != ReduceOp::sum && op != ReduceOp::avg) {
    throw InvalidArgument(what + ": reduce_scatter supports op sum and avg, got " + reduce_op_name(op));
  }
}

void require_root(int root, int size, const std::string& what) {
  if (root < 0 || root >= size) {
    throw InvalidArgument(what + ": root " + std::to_string(root) + " is not a rank of a world of " +
                          std::to_string(size));
  }
}

void require_no_partial_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes, const void* allowed_alias,
                                const std::string& what) {
  if (a_bytes == 0 || b_bytes == 0 || b == allowed_alias) return;
  auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  if (a0 < b0 + b_bytes && b0 < a0 + a_bytes) {
    throw InvalidArgument(what +
                          ": input and output buffers overlap; the only aliasing allowed is the in-place "
                          "layout (the rank's own slice of the larger buffer)");
  }
}

}  // namespace zero3::comm
