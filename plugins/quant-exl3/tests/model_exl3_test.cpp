// The format through the SDK and a whole model: the built plugin registers `exl3`, a recipe selecting it validates,
// and a tiny glm4_moe_lite checkpoint with most projections (experts included) turned into EXL3 modules with random
// codes, mixed with modules left dense (lm_head, one q_b_proj, the router), loads through `weights.format = "exl3"`
// and computes the same logits and greedy tokens as the dense model whose weights are the dequantized ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "exl3_module.h"
#include "exl3_fixture_checkpoint.h"
#include "exl3_test_source.h"
#include "model/model_loader.h"
#include "model/safetensors_file.h"
#include "model/safetensors_writer.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"

namespace kiln::exl3 {
namespace {
namespace fs = std::filesystem;

void load_exl3_plugin() {
  static const Status loaded = [] {
    // Once per process: another test of this binary may have loaded it already.
    if (global_registry().find(PluginKind::kWeightFormat, "exl3")) return ok_status();
    PluginLoader loader(global_registry());
    return loader.load_file(fs::path(KILN_BINARY_DIR) / "lib/kiln/plugins/kiln-quant-exl3.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
}

using test::spec_of;

// Writes `<dir>/exl3` (EXL3 where chosen) and `<dir>/dense` (the same model, every weight dense, the converted ones
// as their dequantized fp32 matrices) from the glm4_moe_lite-tiny fixture.
void write_checkpoints(const fs::path& dir) {
  const fs::path fixture = kiln::testing::model_dir("glm4_moe_lite-tiny");
  auto file = SafetensorsFile::open(fixture / "model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  std::vector<kiln::testing::TensorSpec> quantized, dense;
  std::vector<std::vector<float>> keep;  // dequantized weights, alive until written
  int index = 0;
  for (const std::string& name : file->names()) {
    const TensorView t = *file->get(name);
    const std::string module = name.substr(0, name.size() - 7);
    const bool convert = name.ends_with("_proj.weight") && t.rank == 2 &&
                         name != "model.layers.1.self_attn.q_b_proj.weight";  // one projection stays dense
    if (!convert) {
      quantized.push_back(spec_of(name, t));
      dense.push_back(spec_of(name, t));
      continue;
    }
    test::MemorySource source;
    test::ModuleOptions o;
    o.bits = 2 + index % 5;
    o.codebook = static_cast<Codebook>(index % 3);
    o.legacy_signs = index % 7 == 3;
    const int64_t out = t.shape[0], in = t.shape[1];
    test::add_random_module(source, module, in, out, o, 1000 + index++);
    auto m = read_module(source, module, in, out);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    for (const char* suffix : {".trellis", ".suh", ".svh", ".su", ".sv", ".mcg", ".mul1"})
      if (source.has(module + suffix)) quantized.push_back(spec_of(module + suffix, *source.get(module + suffix)));
    keep.push_back(dequantize(*m));
    dense.push_back({name, "F32", {out, in}, kiln::testing::raw_bytes(keep.back())});
  }
  ASSERT_GT(index, 30) << "most projections should be EXL3";
  for (const char* kind : {"exl3", "dense"}) {
    fs::create_directories(dir / kind);
    fs::copy_file(fixture / "config.json", dir / kind / "config.json");
    fs::copy_file(fixture / "tokenizer.json", dir / kind / "tokenizer.json");
    kiln::testing::write_file(dir / kind / "model.safetensors",
                              kiln::testing::build_safetensors(std::string(kind) == "exl3" ? quantized : dense));
  }
}

std::vector<std::string> sets(const fs::path& path, const std::string& format) {
  return {"model.path=" + path.string(), "model.device=cpu", "weights.format=" + format, "kv.layout=fp32",
          "kv.block_size=4"};
}

TEST(Exl3Plugin, RegistersTheFormatAndRecipesSelectingItValidate) {
  load_exl3_plugin();
  EXPECT_NE(global_registry().find(PluginKind::kWeightFormat, "exl3"), nullptr);
  auto recipe = load_recipe("", sets(kiln::testing::model_dir("glm4_moe_lite-tiny"), "exl3"), global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
}

// weights.bits and weights.experts_only shape the modules the CUDA format generates for model.load = "dummy"; with a
// checkpoint they would do nothing, so loading refuses them, naming the key (a build without CUDA has no such keys:
// the recipe itself refuses them).
TEST(Exl3Plugin, GeneratorKeysWithACheckpointAreRefusedNamingTheKey) {
  load_exl3_plugin();
  for (const char* key : {"weights.experts_only=true", "weights.bits=3"}) {
    auto s = sets(kiln::testing::model_dir("glm4_moe_lite-tiny"), "exl3");
    s.push_back(key);
    auto recipe = load_recipe("", s, global_registry());
    if (!recipe.ok()) {
      EXPECT_NE(recipe.status().message().find("unknown key"), std::string::npos) << recipe.status().to_string();
      continue;
    }
    auto m = load_model(*recipe, global_registry(), ModelLoadOptions{});
    ASSERT_FALSE(m.ok()) << key;
    const std::string name = std::string(key).substr(0, std::string(key).find('='));
    EXPECT_NE(m.status().message().find("`" + name + "`"), std::string::npos) << m.status().to_string();
    EXPECT_NE(m.status().message().find("model.load = \"dummy\" only"), std::string::npos) << m.status().to_string();
  }
}

TEST(Exl3Model, MixedCheckpointMatchesItsDequantizedDenseTwin) {
  load_exl3_plugin();
  const fs::path dir = fs::temp_directory_path() / ("kiln-exl3-model-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_checkpoints(dir);
  if (HasFatalFailure()) return;
  LoadedModel q = kiln::testing::load_recipe_model(sets(dir / "exl3", "exl3"));
  LoadedModel d = kiln::testing::load_recipe_model(sets(dir / "dense", "dense"));
  // The fixture as trained: the random codes must make a different model, or the comparison proves nothing.
  LoadedModel original = kiln::testing::load_recipe_model(sets(kiln::testing::model_dir("glm4_moe_lite-tiny"), "dense"));
  ASSERT_TRUE(q.model && d.model && original.model);

  const std::vector<int32_t> prompt = {1, 17, 400, 23, 9, 3000, 77};
  std::vector<float> logits[3];
  LoadedModel* models[3] = {&q, &d, &original};
  for (int k = 0; k < 3; ++k) {
    kiln::testing::TestKv kv(*models[k], 16);
    std::vector<int32_t> table;
    ASSERT_TRUE(kv.reserve(table, 16).ok());
    SequenceStep step{prompt, 0, &table, true};
    StepOptions options;
    options.want_logits = true;
    StepOutput out;
    ASSERT_TRUE(models[k]->model->step({&step, 1}, {}, kv.views(), options, out).ok());
    logits[k] = out.logits;
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_LT(kiln::testing::relative_error(logits[0].data(), logits[1].data(), logits[1].size()), 1e-4);
  EXPECT_GT(kiln::testing::relative_error(logits[0].data(), logits[2].data(), logits[2].size()), 1e-2);
  EXPECT_EQ(kiln::testing::greedy_reference(q, prompt, 8), kiln::testing::greedy_reference(d, prompt, 8));
  // model.precision = "bf16" hands the format bf16-rounded scales; the model still loads and generates.
  auto bf16_sets = sets(dir / "exl3", "exl3");
  bf16_sets.push_back("model.precision=bf16");
  LoadedModel b = kiln::testing::load_recipe_model(bf16_sets);
  ASSERT_TRUE(b.model);
  EXPECT_EQ(kiln::testing::greedy_reference(b, prompt, 4).size(), 4u);
  fs::remove_all(dir);
}

// The seeds' shape: routed experts EXL3 (random codes, every K and codebook), everything else dense. Under tensor
// parallelism the ranks split the dense modules by rows (served by the built-in format from the sharded view) and
// take their experts whole: two ranks as threads give one rank's greedy tokens.
TEST(Exl3Model, ExpertsOnlyCheckpointSplitsAcrossRanks) {
  load_exl3_plugin();
  const fs::path dir = fs::temp_directory_path() / ("kiln-exl3-experts-tp-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const int converted = test::write_exl3_fixture(
      dir,
      [](const std::string& name, const TensorView&, int) -> std::optional<test::ModuleOptions> {
        if (name.find(".mlp.experts.") == std::string::npos || !name.ends_with("_proj.weight")) return std::nullopt;
        // One K and codebook per projection kind across a layer's experts, as the CUDA expert kernels take them.
        const std::string module = name.substr(0, name.size() - 7);
        const bool gate = module.ends_with("gate_proj"), up = module.ends_with("up_proj");
        test::ModuleOptions o;
        o.bits = gate ? 3 : up ? 4 : 2;
        o.codebook = gate ? Codebook::kMcg : up ? Codebook::kMul1 : Codebook::k3Inst;
        return o;
      },
      3000);
  ASSERT_GT(converted, 20);
  LoadedModel one = kiln::testing::load_recipe_model(sets(dir, "exl3"));
  auto two_sets = sets(dir, "exl3");
  two_sets.push_back("parallel.tensor=2");
  LoadedModel two = kiln::testing::load_recipe_model(two_sets);
  ASSERT_TRUE(one.model && two.model);
  const std::vector<int32_t> prompt = {1, 17, 400, 23, 9, 3000, 77};
  EXPECT_EQ(kiln::testing::greedy_reference(two, prompt, 12), kiln::testing::greedy_reference(one, prompt, 12));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::exl3
