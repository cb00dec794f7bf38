#include "engine/cache_manager.h"

#include <string>

namespace kiln {

Result<std::unique_ptr<CacheManager>> CacheManager::create(const CacheSpec& spec, const KvLayout* layout,
                                                           DeviceContext* device, const CacheManagerConfig& config) {
  if (config.num_blocks < 1 || config.block_size < 1)
    return invalid_argument("the KV pool needs at least one block of at least one token");
  std::unique_ptr<CacheManager> m(new CacheManager(config));
  m->device_ = device;
  m->state_slots_ = spec.has_state() ? config.state_slots : 0;
  m->views_.block_size = config.block_size;
  m->views_.num_blocks = config.num_blocks;
  m->views_.layout = layout;
  KILN_RETURN_IF_ERROR(m->allocate(spec));
  for (int64_t s = m->state_slots_ - 1; s >= 0; --s) m->state_free_.push_back(static_cast<int32_t>(s));
  return m;
}

Status CacheManager::allocate(const CacheSpec& spec) {
  CacheViews& views = views_;
  views.layers.assign(spec.layers.size(), {});
  const size_t tokens = static_cast<size_t>(views.num_blocks * views.block_size);
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    for (const CacheEntry& e : spec.layers[l].entries) {
      size_t bytes = 0;
      if (e.kind == CacheKind::kMlaLatent) {
        if (!views.layout) return invalid_argument("layer " + std::to_string(l) + " caches MLA latents but no KV layout is set");
        bytes = tokens * views.layout->bytes_per_token();
      } else if (e.kind == CacheKind::kPagedRows) {
        bytes = tokens * e.row_bytes;
      } else {
        bytes = static_cast<size_t>(state_slots_) * e.slot_bytes * 2;  // slots, then their snapshots
      }
      void* p = nullptr;
      if (device_ && bytes > 0) {
        const std::string what = "layer " + std::to_string(l) + " " + e.name;
        KILN_ASSIGN_OR_RETURN(p, device_->allocate(bytes, what.c_str()));
      }
      views.layers[l].push_back(p);
      bytes_ += device_ ? bytes : 0;
      if (e.kind == CacheKind::kState) {
        char* base = static_cast<char*>(p);
        const size_t half = static_cast<size_t>(state_slots_) * e.slot_bytes;
        state_entries_.push_back({base, base ? base + half : nullptr, e.slot_bytes});
        state_bytes_ += e.slot_bytes;
      }
    }
  }
  return ok_status();
}

Result<int32_t> CacheManager::acquire_state_slot() {
  if (!has_state()) return -1;
  if (state_free_.empty())
    return resource_exhausted("all " + std::to_string(state_slots_) + " state slots are held (scheduler.max_num_seqs)");
  const int32_t slot = state_free_.back();
  state_free_.pop_back();
  return slot;
}

void CacheManager::release_state_slot(int32_t slot) {
  if (slot >= 0 && has_state()) state_free_.push_back(slot);
}

Status CacheManager::copy_state(int32_t slot, bool to_snapshot) {
  if (!has_state()) return ok_status();
  if (slot < 0 || slot >= state_slots_) return out_of_range("state slot " + std::to_string(slot) + " does not exist");
  if (!device_) return ok_status();
  for (const StateEntry& e : state_entries_) {
    char* live = e.slots + static_cast<size_t>(slot) * e.slot_bytes;
    char* snap = e.snapshots + static_cast<size_t>(slot) * e.slot_bytes;
    KILN_RETURN_IF_ERROR(to_snapshot ? device_->copy(snap, live, e.slot_bytes, false)
                                     : device_->copy(live, snap, e.slot_bytes, false));
  }
  return ok_status();
}

Status CacheManager::snapshot_state(int32_t slot) { return copy_state(slot, true); }
Status CacheManager::restore_state(int32_t slot) { return copy_state(slot, false); }

}  // namespace kiln
