// Launching with programmatic dependent launch (Hopper and later), for the core's kernels and plugins' alike: a
// kernel launched with the attribute may start while the kernel before it on the stream finishes, so its launch
// latency and independent prologue overlap that tail. The kernel must keep the contract in the core's pdl.cuh
// (touch nothing earlier kernels write before pdl_wait(), then pdl_launch_dependents()).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace kiln::cuda {

// Whether this device can and should use PDL: sm_90+ unless KILN_PDL=0 (the A/B switch for measuring it). Queries
// the current device each call: callers cache the answer.
inline bool pdl_supported_on_current_device() {
  const char* env = std::getenv("KILN_PDL");
  if (env && std::strcmp(env, "0") == 0) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 9;  // griddepcontrol and the launch attribute arrive with Hopper
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialisation attribute set to `pdl`. Its
// launch error comes back as from cudaGetLastError.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_with_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            bool pdl, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kiln::cuda
