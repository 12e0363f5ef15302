#include "comm/collective_args.hpp"

#include <cstdint>

#include "zero3/error.hpp"

namespace zero3::comm {

std::string describe_collective(const char* collective, size_t count, DType dtype, int rank, int size,
                                const char* op_name, int root) {
  std::string s =
      std::string(collective) + "(count=" + std::to_string(count) + ", dtype=" + std::string(dtype_name(dtype));
  if (op_name) s += std::string(", op=") + op_name;
  if (root >= 0) s += ", root=" + std::to_string(root);
  s += ") on rank " + std::to_string(rank) + " of " + std::to_string(size);
  return s;
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
