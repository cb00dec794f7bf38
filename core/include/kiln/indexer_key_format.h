// How the DSA lightning indexer's key cache stores one token's key (GLM-5 `glm_moe_dsa`, DeepSeek-V3.2): the KV
// layout decides (KvLayout::indexer_key_format), the architecture sizes its "indexer_keys" cache entry from it and
// the core's indexer appends and scores in it, on the CPU and on CUDA.
//
//   kFp32           dim fp32 values (4·dim bytes; 512 for the published 128-d keys).
//   kFp8E4m3Scaled  [0, dim) the key as e4m3 codes of k_i / scale (OCP E4M3FN, to nearest even, saturating), then
//                   [dim, dim + 4) the fp32 scale = max(amax / 448, FLT_MIN) over the whole key: dim + 4 bytes (132
//                   for 128-d keys), as vLLM's DeepSeek-V3.2 indexer cache. Codes first so they start the row at
//                   any alignment the row has; dim is a multiple of 4 in every published model, so the scale is
//                   4-byte aligned whenever the pages are. A key reads back as e4m3 · scale; scores take the dot
//                   product with the codes and multiply by the scale once (the codec: kiln/indexer_key_codec.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

// Values are part of the ABI (a layout built against this SDK returns them): append only.
enum class IndexerKeyFormat : uint32_t { kFp32 = 0, kFp8E4m3Scaled = 1 };

inline const char* indexer_key_format_name(IndexerKeyFormat f) {
  switch (f) {
    case IndexerKeyFormat::kFp32: return "fp32";
    case IndexerKeyFormat::kFp8E4m3Scaled: return "fp8 e4m3 + fp32 scale";
  }
  return "?";
}

// Bytes one token's key of `dim` values takes in `f`.
inline size_t indexer_key_row_bytes(IndexerKeyFormat f, int64_t dim) {
  const size_t d = static_cast<size_t>(dim);
  return f == IndexerKeyFormat::kFp8E4m3Scaled ? d + 4 : 4 * d;
}

}  // namespace kiln
