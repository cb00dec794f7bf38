#include "engine/kv_capacity.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace kiln {
namespace {
std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}
}  // namespace

std::string KvCapacity::report() const {
  char windows_text[32];
  std::snprintf(windows_text, sizeof windows_text, "%.2f", windows());
  std::string state;
  if (state_bytes > 0)
    state = "; state slots for " + with_commas(max_num_seqs) + (max_num_seqs == 1 ? " sequence (" : " sequences (") +
            gib(state_bytes) + " with snapshots)";
  return "KV cache: " + with_commas(tokens()) + " tokens = " + windows_text + " windows of " +
         with_commas(max_model_len) + " (" + with_commas(num_blocks) + " blocks of " + std::to_string(block_size) +
         " tokens, " + gib(bytes) + ")" + state;
}

uint64_t kv_bytes_per_token(int64_t num_layers, uint64_t layout_bytes_per_token, int64_t index_head_dim,
                            IndexerKeyFormat index_keys) {
  const uint64_t keys = index_head_dim > 0 ? indexer_key_row_bytes(index_keys, index_head_dim) : 0;
  return static_cast<uint64_t>(num_layers) * (layout_bytes_per_token + keys);
}

Result<KvCapacity> plan_kv_capacity(const KvPoolBudget& b) {
  if (b.bytes_per_token == 0 || b.block_size <= 0 || b.max_model_len <= 0)
    return invalid_argument("KV pool: bytes_per_token, block_size and max_model_len must be positive");
  const double usable = b.utilization * static_cast<double>(b.memory_bytes);
  const double taken = static_cast<double>(b.weight_bytes) + static_cast<double>(b.workspace_bytes);
  const int64_t stored = b.stored_per_block > 0 ? b.stored_per_block : b.block_size;
  const uint64_t block_bytes = b.bytes_per_token * static_cast<uint64_t>(stored);
  int64_t blocks = usable > taken ? static_cast<int64_t>((usable - taken) / static_cast<double>(block_bytes)) : 0;
  if (b.max_tokens > 0) blocks = std::min(blocks, (b.max_tokens + b.block_size - 1) / b.block_size);
  const int64_t window_blocks = (b.max_model_len + b.block_size - 1) / b.block_size;
  if (blocks < window_blocks)
    return resource_exhausted(
        "KV pool: " + gib(static_cast<uint64_t>(b.utilization * static_cast<double>(b.memory_bytes))) + " usable (" +
        std::to_string(b.utilization) + " of " + gib(b.memory_bytes) + ") − weights " + gib(b.weight_bytes) +
        " − workspace " + gib(b.workspace_bytes) + " leaves room for " + with_commas(blocks * b.block_size) +
        " KV tokens, fewer than one max_model_len window (" + with_commas(b.max_model_len) +
        " tokens); lower scheduler.max_model_len or raise scheduler.gpu_memory_utilization");
  KvCapacity c;
  c.num_blocks = blocks;
  c.block_size = b.block_size;
  c.max_model_len = b.max_model_len;
  c.bytes = static_cast<uint64_t>(blocks) * block_bytes;
  return c;
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace kiln
