#include "support/stream_path_comm.hpp"

#include "zero3/error.hpp"

namespace zero3::testing {

StreamPathComm::StreamPathComm(std::shared_ptr<Communicator> inner, StreamPathDevice& device)
    : inner_(std::move(inner)), device_(device) {}

void StreamPathComm::note_buffers(const void* a, const void* b) {
  if (!device_.is_device_memory(a) || !device_.is_device_memory(b)) host_memory_collectives_++;
}

Stream StreamPathComm::stream_of(Stream stream) {
  if (stream != nullptr) return stream;
  // NCCL's nullptr: CUDA's legacy default stream, which is not the caller's compute stream.
  if (device_.computes_on_callers_stream()) legacy_stream_collectives_++;
  return device_.legacy_stream();
}

WorkPtr StreamPathComm::all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  stream = stream_of(stream);
  if (!device_.is_compute(stream)) side_stream_gathers_++;
  if (count > 0) note_buffers(out, in);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  return device_.enqueue_collective(
      stream, [inner, out, in, count, dtype] { inner->all_gather_into(out, in, count, dtype)->wait(); }, out,
      bytes * static_cast<size_t>(size()), in, bytes);
}

WorkPtr StreamPathComm::reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op,
                                       Stream stream) {
  stream = stream_of(stream);
  if (!device_.is_compute(stream)) side_stream_reductions_++;
  if (count > 0) note_buffers(out, in);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  return device_.enqueue_collective(
      stream, [inner, out, in, count, dtype, op] { inner->reduce_scatter(out, in, count, dtype, op)->wait(); }, out,
      bytes, in, bytes * static_cast<size_t>(size()));
}

WorkPtr StreamPathComm::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) {
  stream = stream_of(stream);
  if (!device_.is_compute(stream)) side_stream_reductions_++;
  if (count > 0) note_buffers(buf, buf);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  return device_.enqueue_collective(
      stream, [inner, buf, count, dtype, op] { inner->all_reduce(buf, count, dtype, op)->wait(); }, buf, bytes, nullptr,
      0);
}

WorkPtr StreamPathComm::broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) {
  stream = stream_of(stream);
  if (count > 0) note_buffers(buf, buf);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  return device_.enqueue_collective(
      stream, [inner, buf, count, dtype, root] { inner->broadcast(buf, count, dtype, root)->wait(); }, buf, bytes,
      nullptr, 0);
}

std::unique_ptr<Communicator> StreamPathComm::split(int, int) {
  throw Unsupported("stream-path test communicator does not support split");
}

}  // namespace zero3::testing
