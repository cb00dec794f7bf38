#include <cstdlib>
#include <cstring>

#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("KILN_PDL");
    if (env && std::strcmp(env, "0") == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    return major >= 9;  // griddepcontrol and the launch attribute arrive with Hopper
  }();
  return enabled;
}

}  // namespace kiln::cuda
