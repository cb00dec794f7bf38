#include "builtin/paged_mla_kv_layout.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/half_float.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/random_data.h"

namespace kiln::builtin {
namespace {

ModelInfo mla_model(int64_t latent, int64_t rope) {
  ModelInfo m;
  m.model_type = "glm4_moe_lite";
  m.kv_lora_rank = latent;
  m.qk_rope_head_dim = rope;
  return m;
}

std::unique_ptr<KvLayout> make_layout(const ModelInfo& model, int64_t block_size) {
  RecipeSection section("kv");
  section.set("block_size", block_size, "test");
  CreateContext ctx{&section, Device::cpu(), &model};
  auto layout = create_bf16_kv_layout(ctx);
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  return std::move(layout).value();
}

// Appends final rows: row i = c[i] then k[i].
Status write(const KvLayout& layout, void* cache, const int64_t* slots, int64_t n, const float* c, const float* k) {
  const KvGeometry g = layout.geometry();
  std::vector<float> rows(n * (g.latent_dim + g.rope_dim));
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(c + i * g.latent_dim, g.latent_dim, rows.data() + i * (g.latent_dim + g.rope_dim));
    std::copy_n(k + i * g.rope_dim, g.rope_dim, rows.data() + i * (g.latent_dim + g.rope_dim) + g.latent_dim);
  }
  KvAppendArgs a;
  a.pages = cache, a.slots = slots, a.n = n, a.rows = rows.data();
  return layout.append(a, Stream{});
}

TEST(Bf16KvLayout, GeometryFromModelAndRecipe) {
  const ModelInfo glm = mla_model(512, 64);
  auto layout = make_layout(glm, 16);
  EXPECT_EQ(layout->geometry().latent_dim, 512);
  EXPECT_EQ(layout->geometry().rope_dim, 64);
  EXPECT_EQ(layout->geometry().block_size, 16);
  EXPECT_EQ(layout->bytes_per_token(), 1152u);

  CreateContext defaults{nullptr, Device::cpu(), &glm};
  auto d = create_bf16_kv_layout(defaults);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->geometry().block_size, 64);

  CreateContext no_model{nullptr, Device::cpu(), nullptr};
  EXPECT_EQ(create_bf16_kv_layout(no_model).status().code(), StatusCode::kFailedPrecondition);

  RecipeSection bad("kv");
  bad.set("block_size", int64_t{0}, "configs/x.toml:3");
  CreateContext bad_ctx{&bad, Device::cpu(), &glm};
  const Status s = create_bf16_kv_layout(bad_ctx).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv.block_size"), std::string::npos);
  EXPECT_NE(s.message().find("configs/x.toml:3"), std::string::npos);
}

TEST(Bf16KvLayout, AppendGatherRoundTripsWithinBf16Rounding) {
  const int64_t latent = 40, rope = 8, block = 4;
  auto layout = make_layout(mla_model(latent, rope), block);
  EXPECT_EQ(layout->append_fusions(), 0u) << "the CPU layout stores final rows";
  const int64_t row = latent + rope;
  std::vector<uint16_t> cache(8 * block * row, 0);
  // Two sequences on scattered pages; the second's 6th token is padding (negative slot: not stored).
  const int32_t tables[2][3] = {{5, 1, 7}, {2, 6, 0}};
  const int64_t lens[2] = {11, 9};
  std::vector<std::vector<float>> c(2), k(2);
  for (int s = 0; s < 2; ++s) {
    c[s] = test::random_floats(lens[s] * latent, 101 + s, -10.f, 10.f);
    k[s] = test::random_floats(lens[s] * rope, 103 + s, -10.f, 10.f);
    std::vector<int64_t> slots(lens[s]);
    for (int64_t p = 0; p < lens[s]; ++p) slots[p] = tables[s][p / block] * block + p % block;
    if (s == 1) slots[5] = -1;
    ASSERT_TRUE(write(*layout, cache.data(), slots.data(), lens[s], c[s].data(), k[s].data()).ok());
  }
  // Gathered back: sequence 1 first, then sequence 0, packed.
  const KvGatherSeq seqs[2] = {{1, 0, static_cast<int32_t>(lens[1]), 0}, {0, static_cast<int32_t>(lens[1]), static_cast<int32_t>(lens[0]), 0}};
  std::vector<float> out((lens[0] + lens[1]) * row, -1.f);
  KvGatherArgs g;
  g.pages = cache.data(), g.block_tables = &tables[0][0], g.max_blocks = 3, g.seqs = seqs, g.num_seqs = 2;
  g.max_kv_len = 11, g.out = out.data();
  ASSERT_TRUE(layout->gather(g, Stream{}).ok());
  for (int b = 0; b < 2; ++b) {
    const int s = seqs[b].table_row;
    for (int64_t p = 0; p < lens[s]; ++p) {
      const float* r = out.data() + (seqs[b].key_start + p) * row;
      if (s == 1 && p == 5) {  // never written: the page's zeros
        for (int64_t j = 0; j < row; ++j) EXPECT_EQ(r[j], 0.f);
        continue;
      }
      for (int64_t j = 0; j < latent; ++j) {
        EXPECT_EQ(r[j], cpu::bf16_to_float(cpu::float_to_bf16(c[s][p * latent + j])));
        EXPECT_NEAR(r[j], c[s][p * latent + j], std::abs(c[s][p * latent + j]) * 0x1p-8f);
      }
      for (int64_t j = 0; j < rope; ++j) EXPECT_EQ(r[latent + j], cpu::bf16_to_float(cpu::float_to_bf16(k[s][p * rope + j])));
    }
  }
  // A position past the table's pages is an error naming it.
  const KvGatherSeq too_long{0, 0, 13, 0};
  g.seqs = &too_long, g.num_seqs = 1, g.max_kv_len = 13;
  EXPECT_EQ(layout->gather(g, Stream{}).code(), StatusCode::kOutOfRange);
  // The prologue is the CUDA layouts' business.
  KvAppendArgs with_prologue;
  const uint16_t w[1] = {0};
  with_prologue.pages = cache.data(), with_prologue.norm_weight = w;
  EXPECT_EQ(layout->append(with_prologue, Stream{}).code(), StatusCode::kInvalidArgument);
}

// Paged absorbed attention (two sequences, scattered pages, causal kv_len per query, optional DSA selection)
// against expanded attention on the same bf16-rounded latents.
TEST(Bf16KvLayout, AttendMatchesExpandedAttention) {
  const int64_t heads = 3, nope = 16, rope = 8, vd = 12, latent = 32, block = 4, max_blocks = 5;
  const cpu::MlaAbsorbDims dims{heads, nope, vd, latent};
  auto layout = make_layout(mla_model(latent, rope), block);
  auto kv_b = test::random_floats(heads * (nope + vd) * latent, 103, -0.3f, 0.3f);
  const int64_t seq_len[2] = {11, 18};
  const int32_t tables[2][max_blocks] = {{7, 2, 9, -1, -1}, {0, 5, 1, 8, 3}};
  const int64_t row = latent + rope;
  std::vector<uint16_t> cache(10 * block * row);

  std::vector<std::vector<float>> c_seq(2), k_seq(2);
  for (int s = 0; s < 2; ++s) {
    c_seq[s] = test::random_floats(seq_len[s] * latent, 104 + s);
    k_seq[s] = test::random_floats(seq_len[s] * rope, 106 + s);
    std::vector<int64_t> slots(seq_len[s]);
    for (int64_t p = 0; p < seq_len[s]; ++p) slots[p] = tables[s][p / block] * block + p % block;
    ASSERT_TRUE(write(*layout, cache.data(), slots.data(), seq_len[s], c_seq[s].data(), k_seq[s].data()).ok());
    for (auto& x : c_seq[s]) x = cpu::bf16_to_float(cpu::float_to_bf16(x));
    for (auto& x : k_seq[s]) x = cpu::bf16_to_float(cpu::float_to_bf16(x));
  }

  // Queries: the last 3 positions of sequence 1 and the last 2 of sequence 0 (a mixed prefill batch).
  const int32_t query_seq[5] = {1, 1, 1, 0, 0};
  const int32_t kv_len[5] = {16, 17, 18, 10, 11};
  const int64_t nq = 5;
  auto q = test::random_floats(nq * heads * (nope + rope), 108);
  std::vector<float> q_abs(nq * heads * row);
  cpu::mla_absorb_query(q.data(), nq, nope + rope, kv_b.data(), dims, q_abs.data(), row);
  for (int64_t th = 0; th < nq * heads; ++th)
    for (int64_t r = 0; r < rope; ++r) q_abs[th * row + latent + r] = q[th * (nope + rope) + nope + r];

  const int64_t width = 4;
  const int32_t selected[nq * width] = {0, 15, 3, -1, 16, 16, 2, 9, 17, -1, -1, -1, 9, 8, 20, 1, 10, 4, 5, 6};
  for (bool sparse : {false, true}) {
    std::vector<float> o_lat(nq * heads * latent);
    MlaAttendArgs args;
    args.cache = cache.data();
    args.num_queries = nq;
    args.num_heads = heads;
    args.q = q_abs.data();
    args.block_tables = &tables[0][0];
    args.max_blocks = max_blocks;
    args.query_seq = query_seq;
    args.kv_len = kv_len;
    args.selected = sparse ? selected : nullptr;
    args.selected_width = sparse ? width : 0;
    args.scale = 0.2f;
    args.out = o_lat.data();
    ASSERT_TRUE(layout->attend(args, Stream{}).ok());
    std::vector<float> absorbed(nq * heads * vd);
    cpu::mla_unabsorb_output(o_lat.data(), nq, kv_b.data(), dims, absorbed.data());

    for (int64_t i = 0; i < nq; ++i) {
      const int s = query_seq[i];
      const int64_t t_kv = kv_len[i];
      std::vector<float> k(t_kv * heads * (nope + rope)), v(t_kv * heads * vd);
      for (int64_t t = 0; t < t_kv; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t r = 0; r < nope + vd; ++r) {
            double acc = 0;
            for (int64_t l = 0; l < latent; ++l) acc += static_cast<double>(kv_b[(h * (nope + vd) + r) * latent + l]) * c_seq[s][t * latent + l];
            if (r < nope) k[(t * heads + h) * (nope + rope) + r] = static_cast<float>(acc);
            else v[(t * heads + h) * vd + r - nope] = static_cast<float>(acc);
          }
          for (int64_t r = 0; r < rope; ++r) k[(t * heads + h) * (nope + rope) + nope + r] = k_seq[s][t * rope + r];
        }
      std::vector<float> expanded(heads * vd);
      cpu::mla_attention_expanded(q.data() + i * heads * (nope + rope), k.data(), v.data(), 1, t_kv, heads, nope + rope,
                                  vd, 0.2f, sparse ? selected + i * width : nullptr, width, expanded.data());
      for (int64_t j = 0; j < heads * vd; ++j)
        ASSERT_NEAR(absorbed[i * heads * vd + j], expanded[j], 1e-5) << "query " << i << " sparse " << sparse;
    }
  }

  // A position whose page is missing from the block table is an error, not a read of page −1.
  MlaAttendArgs bad;
  bad.cache = cache.data();
  bad.num_queries = 1;
  bad.num_heads = heads;
  bad.q = q_abs.data();
  bad.block_tables = &tables[0][0];
  bad.max_blocks = max_blocks;
  const int32_t seq0 = 0, too_long = 13;
  bad.query_seq = &seq0;
  bad.kv_len = &too_long;
  std::vector<float> o(heads * latent);
  bad.out = o.data();
  const Status s = layout->attend(bad, Stream{});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("position 12"), std::string::npos);
}

}  // namespace
}  // namespace kiln::builtin
