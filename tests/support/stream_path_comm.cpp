#include "support/stream_path_comm.hpp"


namespace zero3::testing {

StreamPathComm::StreamPathComm(std::shared_ptr<Communicator> inner, StreamPathDevice& device)
    : StreamPathComm(std::move(inner), device, std::make_shared<Counts>()) {}

StreamPathComm::StreamPathComm(std::shared_ptr<Communicator> inner, StreamPathDevice& device,
                               std::shared_ptr<Counts> counts)
    : inner_(std::move(inner)), device_(device), counts_(std::move(counts)) {}

void StreamPathComm::note_buffers(const void* a, const void* b) {
  if (!device_.is_device_memory(a) || !device_.is_device_memory(b)) counts_->host_memory_collectives++;
}

void StreamPathComm::note_stream(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  collective_streams_.insert(stream);
}

std::set<Stream> StreamPathComm::collective_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return collective_streams_;
}

Stream StreamPathComm::stream_of(Stream stream) {
  if (stream != nullptr) return stream;
  // NCCL's nullptr: CUDA's legacy default stream, which is not the caller's compute stream.
  if (device_.computes_on_callers_stream()) counts_->legacy_stream_collectives++;
  return device_.legacy_stream();
}

WorkPtr StreamPathComm::all_gather_into(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  stream = stream_of(stream);
  note_stream(stream);
  if (!device_.is_compute(stream)) counts_->side_stream_gathers++;
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
  note_stream(stream);
  if (!device_.is_compute(stream)) counts_->side_stream_reductions++;
  if (count > 0) note_buffers(out, in);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  WorkPtr work = device_.enqueue_collective(
      stream, [inner, out, in, count, dtype, op] { inner->reduce_scatter(out, in, count, dtype, op)->wait(); }, out,
      bytes, in, bytes * static_cast<size_t>(size()));
  device_.note_side_reduction(stream);
  return work;
}

WorkPtr StreamPathComm::all_to_all(void* out, const void* in, size_t count, DType dtype, Stream stream) {
  note_stream(stream);
  if (!device_.is_compute(stream)) counts_->side_stream_reductions++;
  if (count > 0) note_buffers(out, in);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype) * static_cast<size_t>(size());
  return device_.enqueue_collective(
      stream, [inner, out, in, count, dtype] { inner->all_to_all(out, in, count, dtype)->wait(); }, out, bytes, in,
      bytes);
}

WorkPtr StreamPathComm::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, Stream stream) {
  stream = stream_of(stream);
  note_stream(stream);
  if (!device_.is_compute(stream)) counts_->side_stream_reductions++;
  if (count > 0) note_buffers(buf, buf);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  WorkPtr work = device_.enqueue_collective(
      stream, [inner, buf, count, dtype, op] { inner->all_reduce(buf, count, dtype, op)->wait(); }, buf, bytes, nullptr,
      0);
  device_.note_side_reduction(stream);
  return work;
}

WorkPtr StreamPathComm::broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) {
  stream = stream_of(stream);
  note_stream(stream);
  if (count > 0) note_buffers(buf, buf);
  auto inner = inner_;
  const size_t bytes = count * dtype_size(dtype);
  return device_.enqueue_collective(
      stream, [inner, buf, count, dtype, root] { inner->broadcast(buf, count, dtype, root)->wait(); }, buf, bytes,
      nullptr, 0);
}

std::unique_ptr<Communicator> StreamPathComm::split(int color, int key) {
  std::unique_ptr<Communicator> part = inner_->split(color, key);
  if (!part) return nullptr;
  return std::unique_ptr<Communicator>(new StreamPathComm(std::move(part), device_, counts_));
}

}  // namespace zero3::testing
