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
  m->target_layers_ = config.target_layers >= 0 ? config.target_layers : static_cast<int64_t>(spec.layers.size());
  m->state_holder_.assign(static_cast<size_t>(m->state_slots_), nullptr);
  KILN_RETURN_IF_ERROR(m->allocate(spec));
  for (int64_t s = m->state_slots_ - 1; s >= 0; --s) m->state_free_.push_back(static_cast<int32_t>(s));
  return m;
}

Status CacheManager::allocate(const CacheSpec& spec) {
  CacheViews& views = views_;
  views.layers.assign(spec.layers.size(), {});
  views.bytes.assign(spec.layers.size(), {});
  const size_t tokens = static_cast<size_t>(views.num_blocks * stored_per_block_);
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
      views.bytes[l].push_back(bytes);
      bytes_ += device_ ? bytes : 0;
      if (e.kind == CacheKind::kState) {
        char* base = static_cast<char*>(p);
        const size_t half = static_cast<size_t>(state_slots_) * e.slot_bytes;
        state_entries_.push_back({base, e.slot_bytes, static_cast<int64_t>(l), views.layers[l].size() - 1, half});
        state_bytes_ += e.slot_bytes;
      }
    }
  }
  return ok_status();
}

Result<int32_t> CacheManager::acquire_state_slot(const std::vector<int32_t>* holder_blocks) {
  if (!has_state()) return -1;
  if (state_free_.empty())
    return resource_exhausted("all " + std::to_string(state_slots_) + " state slots are held (scheduler.max_num_seqs)");
  const int32_t slot = state_free_.back();
  state_free_.pop_back();
  state_holder_[slot] = holder_blocks;
  return slot;
}

void CacheManager::release_state_slot(int32_t slot) {
  if (slot < 0 || !has_state()) return;
  state_holder_[slot] = nullptr;
  state_free_.push_back(slot);
}

int32_t CacheManager::state_slot_of(const int32_t* block_table) const {
  if (!block_table) return -1;
  for (size_t s = 0; s < state_holder_.size(); ++s)
    if (state_holder_[s] && !state_holder_[s]->empty() && state_holder_[s]->data() == block_table)
      return static_cast<int32_t>(s);
  return -1;
}

bool CacheManager::has_state(int64_t layer) const {
  for (const StateEntry& e : state_entries_)
    if (e.layer == layer) return true;
  return false;
}

Status CacheManager::copy_state(int32_t slot, bool to_snapshot, int64_t first, int64_t end) {
  if (!has_state()) return ok_status();
  if (slot < 0 || slot >= state_slots_) return out_of_range("state slot " + std::to_string(slot) + " does not exist");
  if (!device_) return ok_status();
  for (const StateEntry& e : state_entries_) {
    if (e.layer < first || e.layer >= end) continue;
    const size_t live = static_cast<size_t>(slot) * e.slot_bytes, snap = e.snapshot + live;
    KILN_RETURN_IF_ERROR(to_snapshot ? device_->copy(e.slots + snap, e.slots + live, e.slot_bytes, false)
                                     : device_->copy(e.slots + live, e.slots + snap, e.slot_bytes, false));
    if (mirror_)
      mirror_->mirror_state_copy({pool_identity(views_), e.layer, e.entry, to_snapshot ? live : snap,
                                  to_snapshot ? snap : live, e.slot_bytes});
  }
  return ok_status();
}

Status CacheManager::snapshot_state(int32_t slot) { return copy_state(slot, true, 0, target_layers_); }
Status CacheManager::restore_state(int32_t slot) { return copy_state(slot, false, 0, target_layers_); }
Status CacheManager::snapshot_layer_state(int32_t slot, int64_t layer) {
  return copy_state(slot, true, layer, layer + 1);
}
Status CacheManager::restore_layer_state(int32_t slot, int64_t layer) {
  return copy_state(slot, false, layer, layer + 1);
}

}  // namespace kiln
