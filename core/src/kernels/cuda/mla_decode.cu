#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/launch_check.cuh"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/mla_decode_sm90.h"
#include "kernels/cuda/pdl.cuh"
#include "kiln/cuda/mla_decode_tc.cuh"

namespace kiln::cuda {
namespace {

// bf16 rows go straight from the pages into the tensor-core tiles: 512 + kRope values, 16 bytes a piece.
template <int kRope>
struct Bf16Rows {
  static constexpr int kRopeDim = kRope;
  static constexpr int kStagedRowBytes = 0;
  static constexpr int kRow = static_cast<int>(kMlaLatentDim) + kRope;
  static constexpr int kChunks = kRow * 2 / 16;
  __device__ static void copy_row(const void* cache, int64_t slot, uint16_t* tile_row, unsigned char*, int lane) {
    const uint16_t* pages = static_cast<const uint16_t*>(cache);
    const uint16_t* src = slot >= 0 ? pages + slot * kRow : pages;
#pragma unroll
    for (int k = 0; k < (kChunks + 31) / 32; ++k) {
      const int ch = lane + 32 * k;
      if (ch < kChunks) cp_async_16(tile_row + ch * 8, src + ch * 8, slot >= 0);
    }
  }
  __device__ static void widen(const unsigned char*, uint16_t*, int, int, int) {}
};

// The Hopper kernel is opt-in until it is measured faster end to end (bench/RESULTS.md, session 28: its first form
// lost 2–14 % to this kernel in the attention bench; the second is not measured yet).
bool sm90_chosen() {
  static const bool chosen = [] {
    const char* v = std::getenv("KILN_MLA_DECODE");
    return v != nullptr && std::strcmp(v, "sm90") == 0;
  }();
  return chosen;
}

}  // namespace

Status mla_decode_bf16(const MlaDecodeParams& p, StreamHandle stream, MlaDecodeKernel kernel) {
  if (const char* why = mla_decode_check(p)) return invalid_argument(std::string("cuda::mla_decode_bf16: ") + why);
  if (kernel == MlaDecodeKernel::sm90 || (kernel == MlaDecodeKernel::automatic && sm90_chosen() && mla_decode_sm90_takes(p)))
    return mla_decode_sm90(p, stream);
  return check_cuda(launch_mla_decode_tc<Bf16Rows>(p, stream, pdl_enabled()), "cuda::mla_decode_bf16");
}

}  // namespace kiln::cuda
