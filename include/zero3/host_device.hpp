// ZERO3_HOST_DEVICE marks a function that is compiled for the host and, under nvcc, for the device too:
// this is how one kernel source serves the CPU backend (an OpenMP loop) and the CUDA backend (a launch).
#pragma once

#if defined(__CUDACC__)
#define ZERO3_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ZERO3_HOST_DEVICE inline
#endif
