// CreateContext::dense_weights (ABI 2.5): the `exl3` format hands a stack the checkpoint stores dense (no EXL3 tensor
// in any of its modules) to the built-in format the core offers, so those modules run the core's kernels; EXL3
// modules and stacks mixing the two stay with the plugin; without an offered format it serves dense modules itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "exl3_test_source.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"

namespace kiln::exl3 {
namespace {
namespace fs = std::filesystem;

// Records what it is asked for and answers with an error naming itself, so a test sees who served a request.
class RecordingFormat final : public WeightFormat {
 public:
  Result<std::unique_ptr<Linear>> load_linear(const WeightSource&, const LinearSpec& spec) override {
    linears.push_back(spec.names);
    return unimplemented("served by the offered dense format");
  }
  Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource&, const ExpertSpec& spec) override {
    experts.push_back(spec.prefix);
    return unimplemented("served by the offered dense format");
  }
  std::vector<std::vector<std::string>> linears;
  std::vector<std::string> experts;
};

std::shared_ptr<WeightFormat> exl3_format(WeightFormat* dense) {
  static const Status loaded = [] {
    // Once per process: another test of this binary may have loaded it already.
    if (global_registry().find(PluginKind::kWeightFormat, "exl3")) return ok_status();
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-quant-exl3.so");
  }();
  EXPECT_TRUE(loaded.ok()) << loaded.to_string();
  CreateContext ctx;
  ctx.device = Device::cpu();
  ctx.dense_weights = dense;
  auto f = global_registry().create<WeightFormat>("exl3", ctx);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return f.ok() ? *f : nullptr;
}

void add_dense(test::MemorySource& s, const std::string& module, int64_t in, int64_t out) {
  s.add(module + ".weight", DType::kF32, {out, in}, std::vector<float>(static_cast<size_t>(in * out), 0.25f));
}

LinearSpec spec(std::vector<std::string> names, int64_t in, int64_t out) {
  LinearSpec s;
  s.out_features.assign(names.size(), out);
  s.names = std::move(names);
  s.in_features = in;
  return s;
}

TEST(Exl3DenseDelegation, StacksStoredDenseGoToTheOfferedFormatAndTheRestStays) {
  test::MemorySource s;
  test::add_random_module(s, "q", 64, 48, {}, 1);
  add_dense(s, "k", 64, 48);
  add_dense(s, "v", 64, 48);
  RecordingFormat dense;
  auto f = exl3_format(&dense);
  ASSERT_TRUE(f);

  auto kv = f->load_linear(s, spec({"k", "v"}, 64, 48));
  EXPECT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("offered dense format"), std::string::npos) << kv.status().to_string();
  ASSERT_EQ(dense.linears.size(), 1u);
  EXPECT_EQ(dense.linears[0], (std::vector<std::string>{"k", "v"}));

  auto q = f->load_linear(s, spec({"q"}, 64, 48));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  auto mixed = f->load_linear(s, spec({"q", "k"}, 64, 48));  // one Linear of both kinds: the plugin's own
  ASSERT_TRUE(mixed.ok()) << mixed.status().to_string();
  EXPECT_EQ((*mixed)->out_features(), 96);
  EXPECT_EQ(dense.linears.size(), 1u);
}

TEST(Exl3DenseDelegation, ExpertSetsGoToTheOfferedFormatOnlyWhenEveryExpertIsDense) {
  test::MemorySource s;
  for (int e = 0; e < 3; ++e)
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(proj) == "down_proj";
      add_dense(s, "a." + std::to_string(e) + "." + proj, down ? 32 : 64, down ? 64 : 32);
      const std::string b = "b." + std::to_string(e) + "." + proj;
      if (e == 2 && down)
        test::add_random_module(s, b, 32, 64, {}, 7);  // one quantized projection makes the set the plugin's
      else
        add_dense(s, b, down ? 32 : 64, down ? 64 : 32);
    }
  RecordingFormat dense;
  auto f = exl3_format(&dense);
  ASSERT_TRUE(f);
  ExpertSpec a{"a", 3, 64, 32}, b{"b", 3, 64, 32};
  EXPECT_FALSE(f->load_experts(s, a).ok());
  ASSERT_EQ(dense.experts, (std::vector<std::string>{"a"}));
  dense.linears.clear();
  auto mixed = f->load_experts(s, b);
  // The CPU set builds each expert's linears through load_linear: the dense ones are still offered one by one.
  EXPECT_EQ(dense.experts.size(), 1u);
  EXPECT_FALSE(mixed.ok());
  ASSERT_FALSE(dense.linears.empty());
  EXPECT_EQ(dense.linears[0], (std::vector<std::string>{"b.0.gate_proj"}));
}

TEST(Exl3DenseDelegation, WithoutAnOfferedFormatThePluginServesDenseModulesItself) {
  test::MemorySource s;
  add_dense(s, "k", 64, 48);
  auto f = exl3_format(nullptr);
  ASSERT_TRUE(f);
  auto k = f->load_linear(s, spec({"k"}, 64, 48));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  std::vector<float> x(64, 1.0f), y(48, 0.0f);
  LinearRun run;
  run.x = TensorView::contiguous(x.data(), DType::kF32, {1, 64});
  run.y = TensorView::contiguous(y.data(), DType::kF32, {1, 48});
  ASSERT_TRUE((*k)->run(run, Stream{}).ok());
  EXPECT_FLOAT_EQ(y[0], 16.0f);  // 64 · 0.25
}

}  // namespace
}  // namespace kiln::exl3
