#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "builtin/local_collective.h"
#include "builtin/none_drafter.h"
#include "builtin/register_builtins.h"
#include "builtin/text_modality.h"

namespace kiln::builtin {
namespace {

TEST(LocalCollective, WorldOfOne) {
  auto c = std::move(create_local_collective(CreateContext{})).value();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  float buf[3] = {1, 2, 3};
  ASSERT_TRUE(c->all_reduce(buf, 3, DType::kF32, ReduceOp::kSum, Stream{}).ok());
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(buf[2], 3);
  ASSERT_TRUE(c->broadcast(buf, 3, DType::kF32, 0, Stream{}).ok());
  EXPECT_EQ(c->broadcast(buf, 3, DType::kF32, 1, Stream{}).code(), StatusCode::kOutOfRange);
  float out[3] = {};
  ASSERT_TRUE(c->all_gather(buf, out, 3, DType::kF32, Stream{}).ok());
  EXPECT_EQ(std::memcmp(buf, out, sizeof(buf)), 0);
  uint16_t h_in[2] = {7, 9}, h_out[2] = {};
  ASSERT_TRUE(c->reduce_scatter(h_in, h_out, 2, DType::kBF16, ReduceOp::kMax, Stream{}).ok());
  EXPECT_EQ(h_out[1], 9);
  // A device stream needs the device's context (the engine creates collectives with it).
  EXPECT_EQ(c->all_gather(buf, out, 3, DType::kF32, Stream{Device::cuda(0), nullptr}).code(),
            StatusCode::kFailedPrecondition);
}

// A collective without a fused MoE sum says so and touches nothing: the runner then sums and combines itself.
TEST(LocalCollective, HasNoFusedMoeSum) {
  auto c = std::move(create_local_collective(CreateContext{})).value();
  float y[4] = {1, 2, 3, 4}, resid[2] = {5, 6};
  uint16_t w[2] = {0x3f80, 0x3f80}, normed[2] = {11, 12};
  MoeCombineNorm run;
  run.y = y, run.n = 1, run.top_k = 2, run.hidden = 2, run.residual = resid, run.norm_weight = w, run.normed = normed;
  auto fused = c->all_reduce_moe_combine_norm(run, Stream{});
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  EXPECT_FALSE(*fused);
  EXPECT_EQ(resid[0], 5);
  EXPECT_EQ(normed[1], 12);
}

TEST(NoneDrafter, DoesNotDraft) {
  auto d = std::move(create_none_drafter(CreateContext{})).value();
  EXPECT_EQ(d->capabilities().max_depth, 0);
  std::vector<DraftProposal> out;
  const Status s = d->propose(DraftStep{}, out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("drafting is off"), std::string::npos);
  EXPECT_TRUE(d->rollback(1, 5).ok());
}

TEST(TextModality, AcceptsNoMedia) {
  auto m = std::move(create_text_modality(CreateContext{})).value();
  EXPECT_TRUE(m->accepted_mime_types().empty());
  auto r = m->encode(MediaItem{"image/png", {1, 2, 3}}, Stream{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("[media] modality"), std::string::npos);
  EXPECT_NE(r.status().message().find("image/png"), std::string::npos);
}

class RecordingRegistrar : public Registrar {
 public:
  struct Entry {
    std::string description;
    ErasedFactory factory;
    DeviceSet devices;
    SectionSchema schema;
  };
  std::map<std::pair<PluginKind, std::string>, Entry> entries;

 protected:
  Status add_erased(PluginKind kind, const char* name, const char* description, ErasedFactory factory,
                    DeviceSet devices, SectionSchema schema) override {
    if (!entries.emplace(std::make_pair(kind, std::string(name)), Entry{description, factory, devices, std::move(schema)})
             .second)
      return already_exists(name);
    return ok_status();
  }
};

TEST(RegisterBuiltins, RegistersTheReferenceCapabilities) {
  RecordingRegistrar r;
  ASSERT_TRUE(register_builtin_capabilities(r).ok());
  ASSERT_EQ(r.entries.size(), 7u);
  for (auto [kind, name] : {std::pair{PluginKind::kWeightFormat, "dense"}, {PluginKind::kKvLayout, "bf16"},
                            {PluginKind::kKvLayout, "fp32"},
                            {PluginKind::kDrafter, "none"}, {PluginKind::kCollective, "local"},
                            {PluginKind::kCollective, "socket"}, {PluginKind::kModality, "text"}}) {
    auto it = r.entries.find({kind, name});
    ASSERT_NE(it, r.entries.end()) << name;
    EXPECT_FALSE(it->second.description.empty());
    EXPECT_TRUE(it->second.devices.contains(DeviceType::kCpu)) << name;
  }
  // The exact reference layout is a CPU one; the others run wherever this build runs models.
  EXPECT_FALSE(r.entries.at({PluginKind::kKvLayout, "fp32"}).devices.contains(DeviceType::kCuda));
  // Ranks in processes meet in host memory; where this build has CUDA, CUDA ranks stage their buffers through it (a
  // correctness path; `nccl` serves GPU ranks fast): `socket` runs wherever the built-in bf16 layout does.
  EXPECT_EQ(r.entries.at({PluginKind::kCollective, "socket"}).devices.contains(DeviceType::kCuda),
            r.entries.at({PluginKind::kKvLayout, "bf16"}).devices.contains(DeviceType::kCuda));
#ifdef KILN_WITH_CUDA
  EXPECT_TRUE(r.entries.at({PluginKind::kKvLayout, "bf16"}).devices.contains(DeviceType::kCuda));
  EXPECT_TRUE(r.entries.at({PluginKind::kWeightFormat, "dense"}).devices.contains(DeviceType::kCuda));
#endif
  // The erased factory is the real one: calling it through its registered type creates a drafter.
  auto factory = reinterpret_cast<Factory<Drafter>>(r.entries.at({PluginKind::kDrafter, "none"}).factory);
  auto drafter = factory(CreateContext{});
  ASSERT_TRUE(drafter.ok());
  EXPECT_EQ((*drafter)->capabilities().max_depth, 0);

  EXPECT_EQ(register_builtin_capabilities(r).code(), StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace kiln::builtin
