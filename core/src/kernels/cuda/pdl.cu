#include <cstdlib>
#include <cstring>

#include "kernels/cuda/pdl.cuh"

namespace kiln::cuda {

bool pdl_enabled() {
  static const bool enabled = pdl_supported_on_current_device();
  return enabled;
}

}  // namespace kiln::cuda
