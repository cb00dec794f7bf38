// The CacheManager on CPU memory: every layer kind of a CacheSpec gets its memory (paged latents in the layout's
// format, paged rows, per-sequence state slots with a snapshot each), state slots are handed out and taken back,
// and a snapshot restores a slot's state byte for byte (what speculative rollback of recurrent layers relies on).
#include <gtest/gtest.h>

#include <cstring>

#include "builtin/paged_mla_kv_layout.h"
#include "engine/cache_manager.h"
#include "model/model_instance.h"
#include "kiln/model_info.h"
#include "runtime/cpu_device_context.h"

namespace kiln {
namespace {

struct Pool {
  ModelInfo info;
  std::unique_ptr<KvLayout> layout;
  CpuDeviceContext device;
  std::unique_ptr<CacheManager> caches;
};

// Three layers: MLA only; MLA + indexer keys (24 B a token); a recurrent layer (96 B of state per sequence, in two
// entries of 64 and 32).
CacheSpec mixed_spec() {
  CacheSpec spec;
  spec.layers.push_back({{{CacheKind::kMlaLatent, "mla"}}});
  spec.layers.push_back({{{CacheKind::kMlaLatent, "mla"}, {CacheKind::kPagedRows, "indexer_keys", 24}}});
  spec.layers.push_back({{{CacheKind::kState, "recurrent", 0, 64}, {CacheKind::kState, "conv", 0, 32}}});
  return spec;
}

std::unique_ptr<Pool> make_pool(const CacheSpec& spec, int64_t state_slots, int64_t target_layers = -1,
                                int64_t stored_per_block = 0) {
  auto p = std::make_unique<Pool>();
  p->info.kv_lora_rank = 16, p->info.qk_rope_head_dim = 8;
  CreateContext ctx;
  ctx.model = &p->info;
  auto layout = builtin::create_fp32_kv_layout(ctx);
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  p->layout = std::move(layout).value();
  CacheManagerConfig cfg;
  cfg.num_blocks = 10, cfg.block_size = 4, cfg.state_slots = state_slots;
  cfg.target_layers = target_layers, cfg.stored_per_block = stored_per_block;
  auto made = CacheManager::create(spec, p->layout.get(), &p->device, cfg);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  p->caches = std::move(made).value();
  return p;
}

TEST(CacheManager, EveryLayerKindGetsItsMemory) {
  auto p = make_pool(mixed_spec(), 3);
  const CacheViews& v = p->caches->views();
  ASSERT_EQ(v.layers.size(), 3u);
  EXPECT_EQ(v.layers[0].size(), 1u);
  EXPECT_EQ(v.layers[1].size(), 2u);
  EXPECT_EQ(v.layers[2].size(), 2u);
  for (const auto& l : v.layers)
    for (void* e : l) EXPECT_NE(e, nullptr);
  const size_t tokens = 10 * 4, latent = p->layout->bytes_per_token();
  EXPECT_EQ(latent, (16u + 8u) * 4u);  // fp32 rows
  // Two latent caches and one indexer cache over 40 token slots; 3 slots of 96 state bytes, twice (snapshots).
  EXPECT_EQ(p->caches->bytes(), 2 * tokens * latent + tokens * 24 + 3 * 96 * 2);
  EXPECT_GE(p->device.bytes_allocated(), p->caches->bytes());  // allocations are rounded up to alignment
  EXPECT_EQ(mixed_spec().bytes_per_token(latent), 2 * latent + 24);
  EXPECT_EQ(mixed_spec().bytes_per_sequence(), 96u);
}

// A GPU rank of a decode-context group stores its own page (here 2 of each 4-token block): paged entries get that
// share of the memory, state slots all of theirs; the blocks handed out stay the scheduler's.
TEST(CacheManager, ARankOfASplitContextStoresItsPageOfEachBlock) {
  auto p = make_pool(mixed_spec(), 3, -1, 2);
  const size_t tokens = 10 * 2, latent = p->layout->bytes_per_token();
  EXPECT_EQ(p->caches->bytes(), 2 * tokens * latent + tokens * 24 + 3 * 96 * 2);
  EXPECT_EQ(p->caches->views().block_size, 4);
  EXPECT_EQ(p->caches->views().bytes[0][0], tokens * latent);
}

TEST(CacheManager, StateSlotsAreHandedOutUntilNoneAreLeft) {
  auto p = make_pool(mixed_spec(), 2);
  ASSERT_TRUE(p->caches->has_state());
  auto a = p->caches->acquire_state_slot(), b = p->caches->acquire_state_slot();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(p->caches->free_state_slots(), 0);
  auto none = p->caches->acquire_state_slot();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("max_num_seqs"), std::string::npos);
  p->caches->release_state_slot(*a);
  auto again = p->caches->acquire_state_slot();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
}

TEST(CacheManager, ASnapshotRestoresTheSlotsStateExactly) {
  auto p = make_pool(mixed_spec(), 3);
  const CacheViews& v = p->caches->views();
  auto slot = p->caches->acquire_state_slot();
  ASSERT_TRUE(slot.ok());
  auto* recurrent = static_cast<uint8_t*>(v.layers[2][0]) + *slot * 64;
  auto* conv = static_cast<uint8_t*>(v.layers[2][1]) + *slot * 32;
  auto* neighbour = static_cast<uint8_t*>(v.layers[2][0]) + ((*slot + 1) % 3) * 64;
  std::memset(recurrent, 0x11, 64);
  std::memset(conv, 0x22, 32);
  std::memset(neighbour, 0x77, 64);
  ASSERT_TRUE(p->caches->snapshot_state(*slot).ok());
  std::memset(recurrent, 0x33, 64);  // a verification pass advances the state past rejected drafts
  std::memset(conv, 0x44, 32);
  ASSERT_TRUE(p->caches->restore_state(*slot).ok());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(recurrent[i], 0x11) << i;
  for (int i = 0; i < 32; ++i) ASSERT_EQ(conv[i], 0x22) << i;
  for (int i = 0; i < 64; ++i) ASSERT_EQ(neighbour[i], 0x77) << "another sequence's slot changed at " << i;
  EXPECT_EQ(p->caches->restore_state(7).code(), StatusCode::kOutOfRange);
}

// A next-n layer with state (layer 3, past the target's three) keeps its own snapshot: the target's snapshot and
// restore around verification leave it alone, and the draft services find the slot by its holder's block table.
TEST(CacheManager, ANextNLayersStateIsSnapshottedApartFromTheTargets) {
  CacheSpec spec = mixed_spec();
  spec.layers.push_back({{{CacheKind::kState, "mtp_recurrent", 0, 16}}});
  auto p = make_pool(spec, 2, /*target_layers=*/3);
  const CacheViews& v = p->caches->views();
  std::vector<int32_t> table = {4, 5};
  auto slot = p->caches->acquire_state_slot(&table);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(p->caches->state_slot_of(table.data()), *slot);
  std::vector<int32_t> other = {4, 5};
  EXPECT_EQ(p->caches->state_slot_of(other.data()), -1);
  EXPECT_TRUE(p->caches->has_state(3));
  EXPECT_FALSE(p->caches->has_state(1));

  auto* target = static_cast<uint8_t*>(v.layers[2][0]) + *slot * 64;
  auto* mtp = static_cast<uint8_t*>(v.layers[3][0]) + *slot * 16;
  std::memset(target, 0x11, 64);
  std::memset(mtp, 0x55, 16);
  ASSERT_TRUE(p->caches->snapshot_layer_state(*slot, 3).ok());
  std::memset(mtp, 0x66, 16);
  ASSERT_TRUE(p->caches->snapshot_state(*slot).ok());
  std::memset(target, 0x33, 64);
  ASSERT_TRUE(p->caches->restore_state(*slot).ok());
  EXPECT_EQ(target[0], 0x11);
  EXPECT_EQ(mtp[0], 0x66) << "the target's restore touched the next-n layer";
  ASSERT_TRUE(p->caches->restore_layer_state(*slot, 3).ok());
  for (int i = 0; i < 16; ++i) ASSERT_EQ(mtp[i], 0x55) << i;
  EXPECT_EQ(target[0], 0x11);
  p->caches->release_state_slot(*slot);
  EXPECT_EQ(p->caches->state_slot_of(table.data()), -1);
}

// A model that only records the state copies it is told of (what a rank leader forwards to its other processes).
class RecordingModel final : public ModelInstance {
 public:
  Device device() const override { return Device::cpu(); }
  DeviceContext& device_context() override { return device_; }
  size_t weight_bytes() const override { return 0; }
  int64_t vocab_size() const override { return 0; }
  int64_t hidden_size() const override { return 0; }
  int64_t num_mtp_layers() const override { return 0; }
  Status step(std::span<const SequenceStep>, std::span<const TokenSelection>, const CacheViews&, const StepOptions&,
              StepOutput&) override {
    return ok_status();
  }
  Status mtp_step(int64_t, std::span<const SequenceStep>, const float*, const CacheViews&, MtpStepOutput&) override {
    return ok_status();
  }
  Status embed(const int32_t*, int64_t, TensorView) override { return ok_status(); }
  Status lm_head(const TensorView&, float*) override { return ok_status(); }
  Status sample_drafts(const DraftSampleRequest&) override { return ok_status(); }
  void mirror_state_copy(const StateCopy& copy) override { copies.push_back(copy); }

  std::vector<StateCopy> copies;

 private:
  CpuDeviceContext device_;
};

// Every state copy (target and next-n layers alike) is told to the mirror by pool, layer, entry and byte offsets, so
// that replaying the copies in a pool of the same geometry (another process's) leaves the same state there.
TEST(CacheManager, StateCopiesReplayedInAnotherPoolOfTheSameGeometryLeaveTheSameState) {
  CacheSpec spec = mixed_spec();
  spec.layers.push_back({{{CacheKind::kState, "mtp_recurrent", 0, 16}}});
  auto leader = make_pool(spec, 3, /*target_layers=*/3), follower = make_pool(spec, 3, /*target_layers=*/3);
  RecordingModel model;
  leader->caches->set_state_mirror(&model);
  const CacheViews &a = leader->caches->views(), &b = follower->caches->views();
  (void)leader->caches->acquire_state_slot();
  auto slot = leader->caches->acquire_state_slot();
  ASSERT_TRUE(slot.ok());
  for (const CacheViews* v : {&a, &b})
    for (size_t l = 2; l < v->layers.size(); ++l)
      for (size_t e = 0; e < v->layers[l].size(); ++e) std::memset(v->layers[l][e], 0, v->bytes[l][e]);
  // Both pools run the same "steps": the same writes to the live slots.
  auto write_live = [&](uint8_t value) {
    for (const CacheViews* v : {&a, &b}) {
      std::memset(static_cast<uint8_t*>(v->layers[2][0]) + *slot * 64, value, 64);
      std::memset(static_cast<uint8_t*>(v->layers[2][1]) + *slot * 32, value + 1, 32);
      std::memset(static_cast<uint8_t*>(v->layers[3][0]) + *slot * 16, value + 2, 16);
    }
  };
  auto replay = [&] {
    for (const StateCopy& c : model.copies) {
      ASSERT_EQ(c.pool, pool_identity(a));
      ASSERT_LE(c.from + c.bytes, b.bytes[c.layer][c.entry]);
      ASSERT_LE(c.to + c.bytes, b.bytes[c.layer][c.entry]);
      char* base = static_cast<char*>(b.layers[c.layer][c.entry]);
      std::memcpy(base + c.to, base + c.from, c.bytes);
    }
    model.copies.clear();
  };
  write_live(1);
  ASSERT_TRUE(leader->caches->snapshot_state(*slot).ok());
  ASSERT_TRUE(leader->caches->snapshot_layer_state(*slot, 3).ok());
  EXPECT_EQ(model.copies.size(), 3u);  // two target entries, one next-n entry
  replay();
  write_live(0x40);  // drafts verified, then rejected
  ASSERT_TRUE(leader->caches->restore_state(*slot).ok());
  ASSERT_TRUE(leader->caches->restore_layer_state(*slot, 3).ok());
  replay();
  for (size_t l = 0; l < a.layers.size(); ++l)
    for (size_t e = 0; e < a.layers[l].size(); ++e) {
      if (l < 2) continue;  // paged entries: not state
      ASSERT_EQ(a.bytes[l][e], b.bytes[l][e]);
      EXPECT_EQ(std::memcmp(a.layers[l][e], b.layers[l][e], a.bytes[l][e]), 0) << "layer " << l << " entry " << e;
    }
  EXPECT_EQ(static_cast<uint8_t*>(a.layers[2][0])[*slot * 64], 1) << "the restore did not take the state back";
}

TEST(CacheManager, AModelWithoutStateHoldsNoSlots) {
  CacheSpec spec;
  spec.layers.push_back({{{CacheKind::kMlaLatent, "mla"}}});
  auto p = make_pool(spec, 4);
  EXPECT_FALSE(p->caches->has_state());
  auto slot = p->caches->acquire_state_slot();
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(*slot, -1);
  EXPECT_TRUE(p->caches->snapshot_state(0).ok());
}

TEST(CacheManager, ALatentCacheWithoutALayoutIsRefused) {
  CpuDeviceContext device;
  CacheManagerConfig cfg;
  cfg.num_blocks = 2, cfg.block_size = 4;
  auto made = CacheManager::create(mixed_spec(), nullptr, &device, cfg);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("no KV layout"), std::string::npos);
  cfg.num_blocks = 0;
  EXPECT_FALSE(CacheManager::create(mixed_spec(), nullptr, &device, cfg).ok());
}

}  // namespace
}  // namespace kiln
