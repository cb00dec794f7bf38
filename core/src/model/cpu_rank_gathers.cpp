#include "model/cpu_rank_gathers.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/half_float.h"

namespace kiln {
namespace {

const Stream kHostStream{Device::cpu(), nullptr};

}  // namespace

Status gather_rank_units(Collective* collective, const TensorShard& shard, const float* local, int64_t n,
                         int64_t units, int64_t width, float* full) {
  if (!collective) {
    std::copy_n(local, n * units * width, full);
    return ok_status();
  }
  // Every rank sends a block padded to the largest part, so the blocks are of one size as all_gather needs.
  const int64_t block = shard.max_count(units) * width, mine = shard.count(units) * width;
  std::vector<float> send(static_cast<size_t>(n * block), 0.0f), all(static_cast<size_t>(shard.world * n * block));
  for (int64_t t = 0; t < n; ++t) std::copy_n(local + t * mine, mine, send.data() + t * block);
  KILN_RETURN_IF_ERROR(collective->all_gather(send.data(), all.data(), n * block, DType::kF32, kHostStream));
  for (int r = 0; r < shard.world; ++r) {
    const TensorShard other{r, shard.world};
    const int64_t count = other.count(units) * width, offset = other.begin(units) * width;
    for (int64_t t = 0; t < n; ++t) std::copy_n(all.data() + (r * n + t) * block, count, full + t * units * width + offset);
  }
  return ok_status();
}

Status embed_rank_rows(Collective* collective, const TensorShard& shard, const TensorView& embed, int64_t vocab,
                       int64_t hidden, const int32_t* ids, int64_t n, float* out) {
  const int64_t v0 = shard.begin(vocab), v1 = shard.end(vocab);
  // Sharded: this rank's rows into its block of `rows` (others stay 0), then every rank takes each token's row from
  // the block of the rank that owns it.
  std::vector<float> rows;
  float* mine = out;
  if (collective) {
    rows.assign(static_cast<size_t>(n * hidden), 0.0f);
    mine = rows.data();
  }
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < v0 || ids[i] >= v1) continue;
    const size_t row = static_cast<size_t>(ids[i] - v0) * hidden;
    float* dst = mine + i * hidden;
    switch (embed.dtype) {
      case DType::kF32:
        std::copy_n(embed.as<const float>() + row, hidden, dst);
        break;
      case DType::kBF16:
        cpu::bf16_to_float(embed.as<const uint16_t>() + row, dst, hidden);
        break;
      default:
        cpu::fp16_to_float(embed.as<const uint16_t>() + row, dst, hidden);
        break;
    }
  }
  if (!collective) return ok_status();
  std::vector<float> all(static_cast<size_t>(shard.world * n * hidden));
  KILN_RETURN_IF_ERROR(collective->all_gather(rows.data(), all.data(), n * hidden, DType::kF32, kHostStream));
  for (int64_t i = 0; i < n; ++i) {
    int owner = 0;
    while (owner + 1 < shard.world && ids[i] >= TensorShard{owner + 1, shard.world}.begin(vocab)) ++owner;
    std::copy_n(all.data() + (owner * n + i) * hidden, hidden, out + i * hidden);
  }
  return ok_status();
}

}  // namespace kiln
