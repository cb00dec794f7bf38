#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/tma.cuh"

namespace kiln::cuda {

// cuTensorMapEncodeTiled through the runtime's driver entry point, so nothing links libcuda directly.
static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      ptr = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

Status make_bf16_tensor_map_128b(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                 const uint64_t* strides_elems, const uint32_t* box, const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  if (!encode) return internal_error(std::string(what) + ": cuTensorMapEncodeTiled unavailable");
  cuuint64_t g_dims[5], g_strides[4];
  cuuint32_t g_box[5], elem_strides[5];
  for (int i = 0; i < rank; ++i) {
    g_dims[i] = dims[i];
    g_box[i] = box[i];
    elem_strides[i] = 1;
    if (i + 1 < rank) g_strides[i] = strides_elems[i] * 2;
  }
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank), const_cast<void*>(base),
                            g_dims, g_strides, g_box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return internal_error(std::string(what) + ": cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return ok_status();
}

}  // namespace kiln::cuda
