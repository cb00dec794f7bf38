// Batch invariance of the CUDA runner: in a step of at most kBatchInvariantMaxRows rows, a sequence's decode row
// and its speculative verification rows get logits bitwise equal to plain one-row decoding of the same tokens,
// whatever else shares the step (other sequences' decode and verification rows, a short prompt chunk through the
// decode path, a longer one through the prefill kernel) and wherever the sequence sits in it. This is what makes
// greedy MTP drafting lossless on the GPU (cuda_speculative_test.cpp checks that end to end). On the trained
// tiny-glm, on the glm4_moe_lite-tiny fixture (both attend through the reference MLA kernel, their latent is
// narrow), and on dummy weights with GLM-4.7-Flash's attention widths (latent 512 + rope 64, 20 heads: the
// tensor-core decode kernel, long enough contexts for several KV splits).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/test_model.h"
#include "model/model_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "runtime/cuda/cuda_mla_moe_model.h"
#include "runtime/cuda/cuda_model_step.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kBlockSize = 4;
constexpr int64_t kDepth = 5;  // verification rows of a sequence: 1 + kDepth

// Small everywhere but the attention, which has GLM-4.7-Flash's head count and latent / rope widths.
constexpr const char* kFlashAttentionConfig = R"({
  "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "dtype": "bfloat16",
  "hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
  "mlp_layer_types": ["dense", "sparse"], "first_k_dense_replace": 1, "n_routed_experts": 8,
  "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
  "routed_scaling_factor": 1.8, "num_attention_heads": 20, "num_key_value_heads": 20, "q_lora_rank": 64,
  "kv_lora_rank": 512, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "qk_head_dim": 128, "v_head_dim": 64,
  "rope_interleave": true, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "vocab_size": 4096, "tie_word_embeddings": false,
  "num_nextn_predict_layers": 0, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": null,
  "attention_bias": false, "hidden_act": "silu"
})";

LoadedModel load(const std::string& name) {
  fs::path path;
  std::string load = "mmap";
  if (name == "tiny-glm") {
    path = fs::path(KILN_SOURCE_DIR) / "models/tiny-glm";
  } else if (name == "flash-attention-dummy") {
    path = fs::temp_directory_path() / "kiln_gpu_batch_invariance_flash";
    fs::create_directories(path);
    std::ofstream(path / "config.json") << kFlashAttentionConfig;
    load = "dummy";
  } else {
    path = fs::path(KILN_SOURCE_DIR) / "tests/data/models" / name;
  }
  auto recipe = load_recipe(
      "",
      {"model.path=" + path.string(), "kv.layout=bf16", "kv.block_size=4", "model.device=cuda", "model.load=" + load},
      global_registry());
  EXPECT_TRUE(recipe.ok()) << recipe.status().to_string();
  auto m = load_model(*recipe, global_registry(), {});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(m).value();
}

// A sequence of the test: its prompt (prefilled alone once), its block table, and the rows it brings to a step.
struct Seq {
  std::vector<int32_t> prompt;
  std::vector<int32_t> table;
  std::vector<int32_t> rows;  // this step's tokens, at positions prompt.size() ..
};

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, DecodeAndVerificationRowsAreBitwiseIndependentOfTheStep) {
  LoadedModel m = load(GetParam());
  ASSERT_TRUE(m.on_gpu());
  const int64_t vocab = m.info.vocab_size;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> token(2, static_cast<int32_t>(vocab - 1));
  // 0 is the sequence under test; 1..5 share its steps; 6 brings prompt chunks (at positions 0.., rewritten
  // each time). Prompt lengths give contexts of one to five 64-key tiles, so the tensor-core kernel splits them.
  const std::vector<int64_t> prompt_lengths = {150, 37, 300, 5, 11, 64, 0};
  constexpr int64_t kRoom = 48;  // positions past the prompt a table covers
  std::vector<Seq> seqs(prompt_lengths.size());
  int32_t next_block = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int64_t t = 0; t < prompt_lengths[i]; ++t) seqs[i].prompt.push_back(token(rng));
    const int64_t blocks = (prompt_lengths[i] + kRoom + kBlockSize - 1) / kBlockSize;
    for (int64_t b = 0; b < blocks; ++b) seqs[i].table.push_back(next_block++);
  }
  kiln::testing::TestKv kv(m, next_block * kBlockSize);
  StepOptions logits;
  logits.want_logits = true;
  auto forward = [&](std::span<const SequenceStep> steps, StepOutput& out) {
    return m.model->step(steps, {}, kv.views(), logits, out);
  };
  StepOutput out;
  for (Seq& s : seqs) {
    if (s.prompt.empty()) continue;
    SequenceStep step{s.prompt, 0, &s.table, false};
    ASSERT_TRUE(forward({&step, 1}, out).ok());
  }

  // Plain decoding of sequence 0's next 1 + kDepth tokens, one row a step.
  Seq& a = seqs[0];
  const int64_t a_len = static_cast<int64_t>(a.prompt.size());
  std::vector<int32_t> drafts;
  for (int64_t i = 0; i <= kDepth; ++i) drafts.push_back(token(rng));
  std::vector<std::vector<float>> plain;
  for (int64_t i = 0; i <= kDepth; ++i) {
    SequenceStep step{{&drafts[i], 1}, a_len + i, &a.table, false};
    ASSERT_TRUE(forward({&step, 1}, out).ok());
    plain.emplace_back(out.logits.begin(), out.logits.begin() + vocab);
  }

  // Steps: {sequence, rows} in step order; sequence 6 brings a prompt chunk, the others decode (1 row) or verify.
  struct Part {
    size_t seq;
    int64_t rows;
  };
  const std::vector<std::vector<Part>> steps = {
      {{0, 1}},
      {{0, 1}, {1, 1}},
      {{2, 6}, {0, 2}},
      {{1, 1}, {2, 1}, {0, 6}, {3, 1}},
      {{0, 4}, {1, 6}, {2, 6}},
      {{6, 12}, {0, 6}},                                 // a short prompt chunk: decode-path rows
      {{0, 6}, {6, 20}},                                 // a prompt chunk through the prefill kernel
      {{0, 1}, {1, 6}, {2, 6}, {3, 6}, {4, 6}, {5, 6}},  // 31 rows
      {{1, 6}, {2, 6}, {3, 6}, {0, 6}, {4, 6}, {5, 2}},  // 32 rows
      {{2, 3}, {0, 6}, {1, 6}, {3, 6}, {4, 6}, {5, 5}},  // 32 rows
  };
  for (size_t si = 0; si < steps.size(); ++si) {
    std::vector<SequenceStep> batch;
    std::vector<std::vector<int32_t>> tokens(steps[si].size());
    int64_t rows = 0, a_index = -1, a_rows = 0;
    for (size_t p = 0; p < steps[si].size(); ++p) {
      const Part& part = steps[si][p];
      Seq& s = seqs[part.seq];
      if (part.seq == 0) {
        tokens[p].assign(drafts.begin(), drafts.begin() + part.rows);
        a_index = static_cast<int64_t>(p), a_rows = part.rows;
      } else {
        for (int64_t r = 0; r < part.rows; ++r) tokens[p].push_back(token(rng));
      }
      rows += part.rows;
      batch.push_back({tokens[p], static_cast<int64_t>(s.prompt.size()), &s.table, part.seq != 6});
    }
    ASSERT_LE(rows, cuda::kBatchInvariantMaxRows);
    ASSERT_TRUE(forward(batch, out).ok()) << "step " << si;
    for (int64_t r = 0; r < a_rows; ++r) {
      const float* got = out.logits.data() + (out.first_row[a_index] + r) * vocab;
      EXPECT_EQ(0, std::memcmp(got, plain[r].data(), vocab * sizeof(float)))
          << GetParam() << ": step " << si << " (" << rows << " rows): row " << r << " of sequence 0 differs from "
          << "plain decoding";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvariance,
                         ::testing::Values("tiny-glm", "glm4_moe_lite-tiny", "flash-attention-dummy"));

}  // namespace
}  // namespace kiln
