// ZS_HOST_DEVICE: a function the CPU code and the CUDA kernels both call, compiled for each side from one
// definition, so that the two cannot drift (offsets, rounding).
#pragma once

#ifdef __CUDACC__
#define ZS_HOST_DEVICE __host__ __device__
#else
#define ZS_HOST_DEVICE
#endif
