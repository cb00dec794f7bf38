// The kernel benchmarks' failure handling: a failed CUDA call or kiln Status ends the program with where and why.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kiln/status.h"

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_OK(x)                                         \
  do {                                                      \
    kiln::Status s_ = (x);                                  \
    if (!s_.ok()) {                                         \
      std::fprintf(stderr, "%s\n", s_.to_string().c_str()); \
      std::exit(1);                                         \
    }                                                       \
  } while (0)
