// The one owner of a model's cache memory and of who holds which part of it:
//   - paged caches of every layer kind the architecture declares (CacheSpec: MLA latents in the KV layout's
//     format, paged rows such as the DSA indexer's keys), all addressed by the BlockManager's block ids, so one
//     block table per sequence serves every paged cache (prefix caching included);
//   - state slots: a fixed-size slot per running sequence for recurrent layers, with one snapshot slot each for
//     rollback (speculative verification restores it);
//   - the drafter's layers: the target's next-n (MTP) layers and a drafter's own caches are more layers of the same
//     spec, paged by the same block tables (so a cached prefix carries their rows too).
// Memory comes from the model's DeviceContext (device memory on CUDA, heap on the CPU); a manager made without
// one only counts blocks (tests whose runner keeps no KV).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "kiln/cache_spec.h"
#include "kiln/device_context.h"
#include "kiln/kv_layout.h"
#include "model/model_instance.h"
#include "model/model_step.h"

namespace kiln {

struct CacheManagerConfig {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  bool prefix_caching = true;
  int64_t lookahead_slots = 0;  // positions reserved past each step (speculative verification)
  int64_t state_slots = 0;      // sequences that can hold state at once (max_num_seqs); used only with state
  // Layers [0, target_layers) are the target's, the rest its next-n layers and a drafter's (−1: all the target's).
  // snapshot_state / restore_state cover the target's; a next-n layer's state is kept by the draft services.
  int64_t target_layers = -1;
  // Tokens of each block this pool stores (0: block_size). Decode-context parallelism on GPUs: a rank's own page of
  // every block (its layout's block size), for every layer's paged entries — the target's and its next-n layers'.
  int64_t stored_per_block = 0;
};

class CacheManager {
 public:
  // `spec` lists every layer: the target's, its next-n layers, then a drafter's own. `layout` formats kMlaLatent
  // entries.
  static Result<std::unique_ptr<CacheManager>> create(const CacheSpec& spec, const KvLayout* layout,
                                                      DeviceContext* device, const CacheManagerConfig& config);
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  BlockManager& blocks() { return blocks_; }
  const BlockManager& blocks() const { return blocks_; }
  const CacheViews& views() const { return views_; }
  // Bytes of cache memory held.
  size_t bytes() const { return bytes_; }

  // State slots (models with recurrent layers; a model without any gets -1 and nothing is held). The holder's
  // block table, when given, identifies the slot to state_slot_of (the draft services know a sequence only by
  // the block table the drafter passes them).
  bool has_state() const { return state_bytes_ > 0; }
  Result<int32_t> acquire_state_slot(const std::vector<int32_t>* holder_blocks = nullptr);
  void release_state_slot(int32_t slot);
  int64_t free_state_slots() const { return static_cast<int64_t>(state_free_.size()); }
  // The slot held with the block table whose pages start at `block_table` (its data() now), or −1.
  int32_t state_slot_of(const int32_t* block_table) const;
  // Copies the target layers' state of `slot` to its snapshot, or back (on the device's stream).
  Status snapshot_state(int32_t slot);
  Status restore_state(int32_t slot);
  // The same for one layer past the target's (a next-n layer), whose snapshot is its own to keep.
  bool has_state(int64_t layer) const;
  Status snapshot_layer_state(int32_t slot, int64_t layer);
  Status restore_layer_state(int32_t slot, int64_t layer);
  // Every state copy is also told to `model` (which outlives this manager), for ranks that keep state in pools of
  // their own.
  void set_state_mirror(ModelInstance* model) { mirror_ = model; }

 private:
  CacheManager(const CacheManagerConfig& config)
      : blocks_(config.num_blocks, config.block_size, config.prefix_caching, config.lookahead_slots),
        stored_per_block_(config.stored_per_block > 0 ? config.stored_per_block : config.block_size) {}
  Status allocate(const CacheSpec& spec);
  // Copies the entries of layers [first, end) of `slot`.
  Status copy_state(int32_t slot, bool to_snapshot, int64_t first, int64_t end);

  BlockManager blocks_;
  CacheViews views_;
  DeviceContext* device_ = nullptr;
  size_t bytes_ = 0;
  // State: per (layer, entry) its slots' memory and, beside it, the snapshots.
  struct StateEntry {
    char* slots = nullptr;  // then, `snapshot` bytes on, the snapshots
    size_t slot_bytes = 0;
    int64_t layer = 0;
    size_t entry = 0;     // index in the layer's entries
    size_t snapshot = 0;  // bytes from `slots` to the snapshots
  };
  std::vector<StateEntry> state_entries_;
  size_t state_bytes_ = 0;
  int64_t state_slots_ = 0;
  std::vector<int32_t> state_free_;
  std::vector<const std::vector<int32_t>*> state_holder_;  // per slot: the holder's block table, if given
  int64_t target_layers_ = 0;
  int64_t stored_per_block_ = 0;  // CacheManagerConfig::stored_per_block
  ModelInstance* mirror_ = nullptr;
};

}  // namespace kiln
