// The handle of a queue of GPU work, as zero3's public API takes it.
//
// zero3::Stream is CUDA's own stream handle: cudaStream_t and the driver API's CUstream are both CUstream_st*,
// declared here without CUDA's headers so that every public header compiles without them. Pass the stream of
// another framework as it is, e.g. at::cuda::getCurrentCUDAStream().stream() from PyTorch, a cudaStream_t your
// code created, or cudaStreamPerThread. nullptr has two meanings, said where a call takes a Stream: a Device's
// operations read it as that device's compute stream (Device::default_stream()); a collective
// (Communicator) reads it as CUDA's legacy default stream, as NCCL does.
//
// The caller's compute stream. make_device("cuda:N", stream) makes a device that computes on `stream`:
// its default_stream() is `stream`, the operations given nullptr run there, allocate() orders its memory
// there, and an Engine on that device runs its kernels there and orders its gathers and reductions against
// it (they run on streams of the engine's own that wait for it, and it waits for them, through events; never
// a host synchronization). The model's kernels then run on the same stream without further ordering.
//
// Ownership: zero3 never creates, destroys or takes over a stream it is given. The caller keeps it alive until
// every Device made with it, and every Engine on such a Device, has been destroyed (their destructors still
// queue work on it and wait for it).
// Threads: a Stream is a plain handle; what may run on it concurrently is CUDA's rule (any thread may queue).
#pragma once

struct CUstream_st;

namespace zero3 {

// A CUDA stream (cudaStream_t), or nullptr (see above).
using Stream = CUstream_st*;

}  // namespace zero3
