// What the CUDA kernel benchmarks share: timing a captured graph (median of 7 replays after 2 warm-ups) and the
// comma-separated size lists of their command lines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_check.h"

// Milliseconds per replay of `exec` on `st`.
inline float time_graph(cudaGraphExec_t exec, cudaStream_t st) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) CHECK_CUDA(cudaGraphLaunch(exec, st));
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    CHECK_CUDA(cudaEventRecord(a, st));
    CHECK_CUDA(cudaGraphLaunch(exec, st));
    CHECK_CUDA(cudaEventRecord(b, st));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[ms.size() / 2];
}

// "1,4,16" → {1, 4, 16}; anything else (empty items, non-numbers, values ≤ 0) ends `program` with exit code 2.
inline std::vector<int64_t> parse_list(const char* text, const char* program) {
  std::vector<int64_t> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v <= 0) {
      std::fprintf(stderr, "%s: bad list '%s'\n", program, text);
      std::exit(2);
    }
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}
