// The CUDA half of `fp8_ds_mla` against its host half (ctest label `gpu`; skipped without a device): append writes
// the same bytes, bit for bit, for every row shape (the named 512 + 64 and NoPE 512 + 0, a small latent, a partial
// last tile; zero, tiny and huge tiles); gather gives the host's dequantized rows rounded to bf16; attention (all
// keys and DSA selections) agrees with the host's to fp32 summation order. Then the trained tiny-glm through the
// CUDA runner and the engine on fp8 pages, and the GLM-5 fixture with its indexer keys in fp8 too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "fp8_gpu_test_support.h"
#include "fp8_mla_kernels.h"
#include "fp8_mla_row.h"
#include "kiln/cuda/mla_decode_plan.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#include "tokenizer/tokenizer.h"

namespace kiln::fp8mla {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kBlock = kTestBlock;

struct Shape {
  int64_t latent, rope;
};

class Fp8MlaCuda : public ::testing::TestWithParam<Shape> {};

TEST_P(Fp8MlaCuda, AppendGatherAndAttendMatchTheHostHalf) {
  load_plugins();
  const Shape sh = GetParam();
  auto gpu = make_layout(Device::cuda(0), sh.latent, sh.rope);
  auto cpu = make_layout(Device::cpu(), sh.latent, sh.rope);
  ASSERT_TRUE(gpu && cpu);
  ASSERT_EQ(gpu->bytes_per_token(), cpu->bytes_per_token());
  const int64_t W = sh.latent + sh.rope, row_bytes = static_cast<int64_t>(cpu->bytes_per_token());
  const int64_t keys = 150, blocks = (keys + kBlock - 1) / kBlock + 2, heads = 4;
  std::mt19937 rng(static_cast<uint32_t>(sh.latent * 7 + sh.rope));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(keys * W);
  for (int64_t t = 0; t < keys; ++t) {
    // Rows of every kind of tile: ordinary, all zero, tiny (subnormal codes), huge.
    const float spread = t % 11 == 3 ? 0.0f : t % 11 == 5 ? 1e-30f : t % 11 == 7 ? 1e30f : std::ldexp(1.0f, t % 9 - 4);
    for (int64_t i = 0; i < W; ++i) rows[t * W + i] = spread * normal(rng);
  }
  std::vector<int32_t> table;
  for (int64_t b = blocks - 1; b >= 0; --b) table.push_back(static_cast<int32_t>(b));  // shuffled pages
  std::vector<int64_t> slots(keys);
  for (int64_t t = 0; t < keys; ++t) slots[t] = table[t / kBlock] * kBlock + t % kBlock;
  slots[17] = -1;  // padding stores nothing

  std::vector<uint8_t> host_pages(static_cast<size_t>(blocks * kBlock * row_bytes), 0);
  KvAppendArgs a;
  a.slots = slots.data(), a.n = keys, a.rows = rows.data(), a.pages = host_pages.data();
  ASSERT_TRUE(cpu->append(a, {}).ok());
  Dev<float> d_rows(rows);
  Dev<int64_t> d_slots(slots);
  Dev<uint8_t> d_pages(host_pages.size());
  ASSERT_EQ(cudaMemset(d_pages.p, 0, host_pages.size()), cudaSuccess);
  a.slots = d_slots.p, a.rows = d_rows.p, a.pages = d_pages.p;
  const Stream stream{Device::cuda(0), nullptr};
  ASSERT_TRUE(gpu->append(a, stream).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_pages.get(), host_pages) << "the device's quantization differs from the host codec";
  slots[17] = table[17 / kBlock] * kBlock + 17 % kBlock;  // position 17's page holds zeros: a valid (zero) row

  // Gather: the host's dequantized rows, rounded to bf16.
  const KvGatherSeq seq{0, 0, static_cast<int32_t>(keys), 0};
  Dev<int32_t> d_table(table);
  Dev<KvGatherSeq> d_seq(std::vector<KvGatherSeq>{seq});
  Dev<uint16_t> d_gathered(static_cast<size_t>(keys * W));
  KvGatherArgs g;
  g.pages = d_pages.p, g.block_tables = d_table.p, g.max_blocks = blocks, g.seqs = d_seq.p, g.num_seqs = 1;
  g.max_kv_len = keys, g.out = d_gathered.p;
  ASSERT_TRUE(gpu->gather(g, stream).ok());
  std::vector<float> decoded(keys * W);
  const RowGeometry row{sh.latent, sh.rope};
  for (int64_t t = 0; t < keys; ++t) decode_row(row, host_pages.data() + slots[t] * row_bytes, decoded.data() + t * W);
  const std::vector<uint16_t> gathered = d_gathered.get();
  int64_t mismatched = 0;
  for (size_t i = 0; i < gathered.size(); ++i) mismatched += gathered[i] != float_to_bf16(decoded[i]);
  EXPECT_EQ(mismatched, 0);

  // Attention: 5 query rows (kv_len 1 .. 150: one to three splits of 64), all keys, then a selection of 100 with
  // pads and repeats; the plain kernel (no workspace) and the split kernel (the plan's workspace).
  const int64_t nq = 5, width = 100;
  std::vector<float> q(nq * heads * W);
  for (float& x : q) x = 0.2f * normal(rng);
  const std::vector<int32_t> query_seq(nq, 0), kv_len = {1, 16, 17, 99, 150};
  std::vector<int32_t> selected(nq * width);
  std::uniform_int_distribution<int32_t> pos(-1, 149);
  for (int32_t& s : selected) s = pos(rng);
  Dev<float> d_q(q);
  Dev<int32_t> d_qs(query_seq), d_kv(kv_len), d_sel(selected);
  for (int variant = 0; variant < 4; ++variant) {
    const bool with_selection = variant % 2 == 1, split = variant >= 2;
    SCOPED_TRACE(std::string(with_selection ? "selection" : "all keys") + (split ? ", split kernel" : ", plain kernel"));
    MlaAttendArgs m;
    m.num_queries = nq, m.num_heads = heads, m.max_blocks = blocks, m.scale = 0.5f, m.max_kv_len = keys;
    m.selected_width = with_selection ? width : 0;
    MlaAttendShape shape;
    shape.num_queries = nq, shape.num_heads = heads, shape.max_kv_len = keys, shape.batch_invariant = true;
    shape.selected_width = m.selected_width;
    const MlaAttendPlan plan = gpu->plan_attend(shape);
    if (split) ASSERT_GT(plan.workspace_bytes, 0u) << "the split kernel takes this shape";
    Dev<char> workspace(split ? plan.workspace_bytes : 0);
    std::vector<float> want(nq * heads * sh.latent);
    m.cache = host_pages.data(), m.q = q.data(), m.block_tables = table.data(), m.query_seq = query_seq.data();
    m.kv_len = kv_len.data(), m.selected = with_selection ? selected.data() : nullptr, m.out = want.data();
    ASSERT_TRUE(cpu->attend(m, {}).ok());
    Dev<float> d_out(want.size());
    m.cache = d_pages.p, m.q = d_q.p, m.block_tables = d_table.p, m.query_seq = d_qs.p, m.kv_len = d_kv.p;
    m.selected = with_selection ? d_sel.p : nullptr, m.out = d_out.p;
    if (split)
      m.workspace = workspace.p, m.workspace_bytes = plan.workspace_bytes, m.num_splits = plan.num_splits,
      m.split_by_length = plan.split_by_length;
    ASSERT_TRUE(gpu->attend(m, stream).ok());
    const std::vector<float> got = d_out.get();
    // Per (row, head): max |Δ| of its largest |out| (rows of 1e30-scale keys beside ordinary ones).
    double worst = 0;
    for (int64_t rh = 0; rh < nq * heads; ++rh) {
      double diff = 0, scale = 0;
      for (int64_t i = rh * sh.latent; i < (rh + 1) * sh.latent; ++i)
        diff = std::max(diff, std::fabs(double(got[i]) - want[i])), scale = std::max(scale, std::fabs(double(want[i])));
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    // The published shapes take the tensor cores (latent 512; rope 64 dense or NoPE: fp8_mla_kernels.h): q, the
    // widened rows and the softmax weights enter them as bf16 (fp32 sums), as in the bf16 layout's kernel — so a
    // bf16-level bound; the CUDA-core kernels of the other shapes are fp32 throughout.
    const bool tensor_cores = sh.latent == 512 && (sh.rope == 0 || m.selected_width == 0);
    std::printf("fp8_ds_mla %lld + %lld attend (%s, %s, %s): GPU vs host, worst max |Δ| of a head's largest "
                "|out| %.3g\n", static_cast<long long>(sh.latent), static_cast<long long>(sh.rope),
                with_selection ? "selection" : "all keys", split ? "planned splits" : "no workspace",
                tensor_cores ? "tensor cores" : "CUDA cores", worst);
    EXPECT_LE(worst, tensor_cores ? 2e-2 : 1e-5);
    if (!split) continue;
    // Batch invariance: the last row alone, planned alone, gives the same bits as among the five.
    MlaAttendShape alone = shape;
    alone.num_queries = 1;
    const MlaAttendPlan plan1 = gpu->plan_attend(alone);
    Dev<char> workspace1(plan1.workspace_bytes);
    Dev<float> d_out1(static_cast<size_t>(heads * sh.latent));
    MlaAttendArgs m1 = m;
    m1.num_queries = 1, m1.q = d_q.p + (nq - 1) * heads * W, m1.query_seq = d_qs.p + nq - 1, m1.kv_len = d_kv.p + nq - 1;
    m1.selected = with_selection ? d_sel.p + (nq - 1) * width : nullptr, m1.out = d_out1.p;
    m1.workspace = workspace1.p, m1.workspace_bytes = plan1.workspace_bytes, m1.num_splits = plan1.num_splits;
    m1.split_by_length = plan1.split_by_length;
    ASSERT_TRUE(gpu->attend(m1, stream).ok());
    const std::vector<float> got1 = d_out1.get();
    EXPECT_TRUE(std::equal(got1.begin(), got1.end(), got.end() - heads * sh.latent))
        << "the last row alone differs from the same row among five";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8MlaCuda,
                         ::testing::Values(Shape{512, 64}, Shape{512, 0}, Shape{32, 16}, Shape{200, 8}),
                         [](const auto& info) {
                           return std::to_string(info.param.latent) + "_" + std::to_string(info.param.rope);
                         });

// The trained tiny-glm through the CUDA runner and the engine on fp8 pages: 32 greedy tokens of a text prompt,
// against the same runner on bf16 pages and against the CPU model on fp8 pages; MTP drafting at depths 1, 3, 5 on
// fp8 pages leaves the GPU's tokens unchanged.
TEST(Fp8MlaCudaModel, TinyGlmOnTheCudaRunner) {
  load_plugins();
  auto sets = [](const std::string& device, const std::string& layout, const std::string& method = "none",
                 int depth = 0) {
    return std::vector<std::string>{"model.path=" + (fs::path(KILN_SOURCE_DIR) / "models/tiny-glm").string(),
                                    "model.device=" + device, "kv.layout=" + layout, "kv.block_size=16",
                                    "scheduler.max_model_len=256", "speculative.method=" + method,
                                    "speculative.depth=" + std::to_string(depth)};
  };
  auto tok = Tokenizer::load(fs::path(KILN_SOURCE_DIR) / "models/tiny-glm/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const std::vector<int32_t> prompt = tok->encode(
      "Return a new sorted list from the items in iterable. A custom key function can be supplied to customize the "
      "sort order, and the reverse flag can be set to request the result in descending order.");
  LoadedModel gpu = kiln::testing::load_recipe_model(sets("cuda", "fp8_ds_mla"), {.load_mtp = true});
  LoadedModel gpu_bf16 = kiln::testing::load_recipe_model(sets("cuda", "bf16"));
  LoadedModel cpu = kiln::testing::load_recipe_model(sets("cpu", "fp8_ds_mla"));
  ASSERT_TRUE(gpu.on_gpu());
  auto fp8 = kiln::testing::engine_generate(gpu, sets("cuda", "fp8_ds_mla"), prompt, 32);
  auto bf16 = kiln::testing::engine_generate(gpu_bf16, sets("cuda", "bf16"), prompt, 32);
  auto host = kiln::testing::engine_generate(cpu, sets("cpu", "fp8_ds_mla"), prompt, 32);
  ASSERT_TRUE(fp8.ok() && bf16.ok() && host.ok()) << fp8.status().to_string() << bf16.status().to_string()
                                                  << host.status().to_string();
  auto same = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    return std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin();
  };
  std::printf("tiny-glm on the CUDA runner, fp8_ds_mla pages: %td of 32 greedy tokens as on bf16 pages, %td as the "
              "CPU model on fp8 pages\n", same(*fp8, *bf16), same(*fp8, *host));
  EXPECT_GE(same(*fp8, *bf16), 24);
  for (int depth : {1, 3, 5}) {
    auto drafted = kiln::testing::engine_generate(gpu, sets("cuda", "fp8_ds_mla", "mtp", depth), prompt, 32);
    ASSERT_TRUE(drafted.ok()) << drafted.status().to_string();
    EXPECT_EQ(*drafted, *fp8) << "mtp depth " << depth;
  }
}

// The GLM-5 fixture (DSA: the indexer's keys fp8 as well under fp8_ds_mla) through the CUDA runner against the CPU
// model (bf16 precision, the GPU's rounding points) on the same layout. Teacher-forced on the CPU's greedy tokens:
// every row's logits within 5e-2 of its largest (the tolerance tests/gpu/cuda_model_test.cpp states for the bf16
// layout) and the GPU's argmax the CPU's unless the CPU's top-1/top-2 gap is below twice that row's measured
// difference (a near-tie). Free-running: the same 32 greedy tokens, or a first difference only at such a near-tie.
TEST(Fp8MlaCudaModel, GlmMoeDsaWithFp8IndexerKeysMatchesTheCpu) {
  load_plugins();
  const std::string name = "glm_moe_dsa-tiny";
  auto sets = [&](const std::string& device) {
    std::vector<std::string> s = {"model.path=" + kiln::testing::model_dir(name).string(), "model.device=" + device,
                                  "kv.layout=fp8_ds_mla", "kv.block_size=16", "scheduler.max_model_len=256"};
    if (device == "cpu") s.push_back("model.precision=bf16");
    return s;
  };
  LoadedModel gpu = kiln::testing::load_recipe_model(sets("cuda"));
  LoadedModel cpu = kiln::testing::load_recipe_model(sets("cpu"));
  ASSERT_TRUE(gpu.on_gpu());
  ASSERT_EQ(gpu.layout->indexer_key_format(), IndexerKeyFormat::kFp8E4m3Scaled);
  constexpr int64_t kNew = 32;
  const std::vector<int32_t> prompt = kiln::testing::load_reference(name).ids("prompt_ids");
  auto on_gpu = kiln::testing::engine_generate(gpu, sets("cuda"), prompt, kNew);
  auto on_cpu = kiln::testing::engine_generate(cpu, sets("cpu"), prompt, kNew);
  ASSERT_TRUE(on_gpu.ok() && on_cpu.ok()) << on_gpu.status().to_string() << on_cpu.status().to_string();

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), on_cpu->begin(), on_cpu->end());
  auto logits = [&](LoadedModel& m) {
    kiln::testing::TestKv kv(m, static_cast<int64_t>(all.size()));
    std::vector<int32_t> table;
    EXPECT_TRUE(kv.reserve(table, static_cast<int64_t>(all.size())).ok());
    SequenceStep step{all, 0, &table, true, 0};
    StepOutput out;
    StepOptions options;
    options.want_logits = true;
    const Status st = m.model->step({&step, 1}, {}, kv.views(), options, out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out.logits;
  };
  const std::vector<float> g = logits(gpu), c = logits(cpu);
  const int64_t vocab = cpu.model->vocab_size(), P = static_cast<int64_t>(prompt.size());
  ASSERT_EQ(g.size(), c.size());
  ASSERT_EQ(static_cast<int64_t>(c.size()), static_cast<int64_t>(all.size()) * vocab);
  auto argmax = [&](const float* row) { return static_cast<int32_t>(std::max_element(row, row + vocab) - row); };
  auto gap = [&](const float* row) {
    std::vector<float> v(row, row + vocab);
    std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
    return static_cast<double>(v[0]) - v[1];
  };
  double worst = 0;
  int near_ties = 0, broken_ties = 0;
  std::vector<char> tie_at(static_cast<size_t>(kNew), 0);
  for (int64_t r = 0; r < static_cast<int64_t>(all.size()); ++r) {
    const float* gr = g.data() + r * vocab;
    const float* cr = c.data() + r * vocab;
    double diff = 0, top = 0;
    for (int64_t i = 0; i < vocab; ++i)
      diff = std::max(diff, std::fabs(double(gr[i]) - cr[i])), top = std::max(top, std::fabs(double(cr[i])));
    worst = std::max(worst, diff / top);
    // 1e-1, not the 5e-2 of the fp32-key test: on the H200 (2026-12-03) one row of 47 measured 0.063. The CUDA keys
    // are the host codec's bytes and the scores agree within 1e-5 (GpuIndexerKeysFp8.*), but this random fixture's
    // indexer scores sit that close at its top-k cut, so a row can attend one other key than the CPU's; the greedy
    // tokens below stay identical (32 of 32 there).
    EXPECT_LE(diff / top, 1e-1) << "row " << r;
    if (r + 1 < P || r - (P - 1) >= kNew) continue;  // greedy choices: the prompt's last row on
    const bool near_tie = gap(cr) < 2 * diff;
    near_ties += near_tie, tie_at[r - (P - 1)] = near_tie;
    if (argmax(gr) != argmax(cr)) {
      ++broken_ties;
      EXPECT_TRUE(near_tie) << "step " << r - (P - 1) << ": GPU argmax " << argmax(gr) << ", CPU " << argmax(cr)
                            << " with a top-1/top-2 gap of " << gap(cr) << " against a difference of " << diff;
    }
  }
  const int64_t same = std::mismatch(on_gpu->begin(), on_gpu->end(), on_cpu->begin(), on_cpu->end()).first -
                       on_gpu->begin();
  std::printf("%s on fp8_ds_mla (fp8 indexer keys), CUDA vs CPU: %lld of %lld free-running greedy tokens identical; "
              "teacher-forced logits worst %.3g of a row's largest, %d near-ties (%d broken)\n",
              name.c_str(), static_cast<long long>(same), static_cast<long long>(kNew), worst, near_ties,
              broken_ties);
  if (same < kNew)
    EXPECT_TRUE(tie_at[static_cast<size_t>(same)]) << "free-running tokens part at step " << same
                                                   << " where the CPU's choice is not a near-tie";
}

}  // namespace
}  // namespace kiln::fp8mla

namespace kiln::fp8mla {
namespace {

// The layout's tensor-core attention against the host's fp32 attention where the short test above cannot reach:
// contexts of up to 4,097 keys (many 64-key tiles a split, several splits and the merge), 5 / 20 / 64 heads (one to
// four n8 tiles, two CTAs a row at 64), rope 64 and NoPE (with DSA selections), rows at scales 2^−4 .. 2^4, all zero
// and tiny. Bound: 2e-2 of a head's largest |out|, as above; and a row's bits alone equal its bits among the others
// (batch invariance).
struct LongShape {
  int64_t rope, heads;
  bool selection;
};

class Fp8MlaLongAttention : public ::testing::TestWithParam<LongShape> {};

TEST_P(Fp8MlaLongAttention, MatchesTheHost) {
  load_plugins();
  const LongShape sh = GetParam();
  const int64_t latent = 512, W = latent + sh.rope, heads = sh.heads, block = kBlock;
  auto cpu = make_layout(Device::cpu(), latent, sh.rope);
  ASSERT_TRUE(cpu);
  const std::vector<int32_t> kv_len = {1, 700, 2500, 4097};
  const int64_t nq = static_cast<int64_t>(kv_len.size()), keys = 4097;
  const int64_t blocks = (keys + block - 1) / block, row_bytes = static_cast<int64_t>(cpu->bytes_per_token());
  std::mt19937 rng(static_cast<uint32_t>(sh.rope * 131 + heads));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(keys * W);
  for (int64_t t = 0; t < keys; ++t) {
    // No huge tiles here (the short test above has them), and scales to 2^4: keys far stronger than the rest decide
    // a head's softmax alone, between near-tied scores that the rounding of q to bf16 reorders (measured with rows
    // to 2^8: 9 % off the host), and would hide everything else.
    const int kind = static_cast<int>(t % 97);
    const float spread = kind == 11 ? 0.0f : kind == 29 ? 1e-30f : std::ldexp(1.0f, static_cast<int>(t % 9) - 4);
    for (int64_t i = 0; i < W; ++i) rows[t * W + i] = spread * normal(rng);
  }
  auto [table, pages] = store_on_shuffled_pages(*cpu, rows, keys, blocks, block, 0, rng);

  std::vector<float> q(nq * heads * W);
  for (float& x : q) x = 0.05f * normal(rng);
  const int64_t width = sh.selection ? 2048 : 0;
  std::vector<int32_t> selected(nq * std::max<int64_t>(width, 1), -1);
  if (sh.selection)
    for (int64_t r = 0; r < nq; ++r) {
      std::vector<int32_t> pos(keys);
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      for (int64_t i = 0; i < width; ++i) selected[r * width + i] = i % 7 == 3 ? -1 : pos[i];
    }
  const std::vector<int32_t> query_seq(nq, 0);

  std::vector<float> want(nq * heads * latent);
  MlaAttendArgs m;
  m.num_queries = nq, m.num_heads = heads, m.max_blocks = blocks, m.scale = 0.07f, m.max_kv_len = keys;
  m.selected_width = width;
  m.cache = pages.data(), m.q = q.data(), m.block_tables = table.data(), m.query_seq = query_seq.data();
  m.kv_len = kv_len.data(), m.selected = sh.selection ? selected.data() : nullptr, m.out = want.data();
  ASSERT_TRUE(cpu->attend(m, {}).ok());

  Dev<uint8_t> d_pages(pages);
  Dev<float> d_q(q);
  Dev<int32_t> d_table(table), d_qs(query_seq), d_kv(kv_len), d_sel(selected);
  const RowGeometry geom{latent, sh.rope};
  AttendParams p;
  p.shape.latent = latent, p.shape.rope = sh.rope, p.shape.tiles = geom.tiles();
  p.shape.scales_offset = geom.scales_offset(), p.shape.rope_offset = geom.rope_offset();
  p.shape.row_bytes = row_bytes;
  p.pages = d_pages.p, p.block_size = block, p.q = d_q.p, p.num_queries = nq, p.num_heads = heads;
  p.block_tables = d_table.p, p.max_blocks = blocks, p.query_seq = d_qs.p, p.kv_len = d_kv.p;
  p.selected = sh.selection ? d_sel.p : nullptr, p.selected_width = width, p.scale = 0.07f;
  ASSERT_TRUE(tc_attend_supported(p.shape, width));
  const int splits = static_cast<int>((cuda::mla_decode_length_splits(sh.selection ? width : keys) + 15) / 16 * 16);
  Dev<char> workspace(cuda::mla_decode_workspace_bytes(nq, heads, splits));
  auto run = [&](int64_t first, int64_t count) {
    Dev<float> out(static_cast<size_t>(count * heads * latent));
    AttendParams r = p;
    r.q = d_q.p + first * heads * W, r.num_queries = count, r.query_seq = d_qs.p + first, r.kv_len = d_kv.p + first;
    r.selected = sh.selection ? d_sel.p + first * width : nullptr, r.out = out.p;
    const char* why = launch_tc_attend(r, splits, true, workspace.p, nullptr);
    EXPECT_EQ(why, nullptr) << why;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return out.get();
  };
  const std::vector<float> all = run(0, nq);
  auto worst_of = [&](const std::vector<float>& got) {
    double worst = 0;
    for (int64_t rh = 0; rh < nq * heads; ++rh) {
      double diff = 0, scale = 0;
      for (int64_t i = rh * latent; i < (rh + 1) * latent; ++i)
        diff = std::max(diff, std::fabs(double(got[i]) - want[i])), scale = std::max(scale, std::fabs(double(want[i])));
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    return worst;
  };
  const double worst = worst_of(all);
  std::printf("fp8_ds_mla 512 + %lld, %lld heads%s, up to %lld keys: worst max |Δ| of a head's largest |out| vs the "
              "host %.3g\n", static_cast<long long>(sh.rope), static_cast<long long>(heads),
              sh.selection ? " (selection)" : "", static_cast<long long>(keys), worst);
  EXPECT_LE(worst, 2e-2);
  for (float x : all) ASSERT_TRUE(std::isfinite(x));
  const std::vector<float> last_alone = run(nq - 1, 1);
  EXPECT_TRUE(std::equal(last_alone.begin(), last_alone.end(), all.end() - heads * latent))
      << "the longest row alone differs from the same row among the others";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8MlaLongAttention,
                         ::testing::Values(LongShape{64, 20, false}, LongShape{64, 5, false}, LongShape{64, 64, false},
                                           LongShape{0, 20, false}, LongShape{0, 64, true}, LongShape{0, 8, true}),
                         [](const auto& info) {
                           return "rope" + std::to_string(info.param.rope) + "_heads" +
                                  std::to_string(info.param.heads) + (info.param.selection ? "_selection" : "");
                         });

}  // namespace
}  // namespace kiln::fp8mla

namespace kiln::fp8mla {
namespace {

// MlaAttendArgs::out_lse through every attention form of the CUDA layout — the plain kernel (no workspace), the split
// form (the plan's workspace) at a small latent, the tensor-core form at 512 + 64 — against the log-sum-exp of the
// host's dequantized rows in double: within 1e-3 (q is rounded to bf16 on the tensor cores only), −inf for a row
// that sees no key. Decode-context parallelism merges ranks with it.
TEST(Fp8MlaLse, EveryAttentionFormWritesTheLogSumExp) {
  load_plugins();
  for (const auto [latent, rope, heads] : {std::tuple<int64_t, int64_t, int64_t>{128, 16, 8}, {512, 64, 20}}) {
    SCOPED_TRACE("latent " + std::to_string(latent) + " + " + std::to_string(rope));
    auto cpu = make_layout(Device::cpu(), latent, rope);
    auto gpu = make_layout(Device::cuda(0), latent, rope);
    ASSERT_TRUE(cpu && gpu);
    const int64_t W = latent + rope, keys = 300, blocks = (keys + kBlock - 1) / kBlock;
    const std::vector<int32_t> kv_len = {0, 1, 9, 17, 300};
    const int64_t nq = static_cast<int64_t>(kv_len.size());
    std::mt19937 rng(static_cast<uint32_t>(latent));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(keys * W), q(nq * heads * W);
    for (float& x : rows) x = normal(rng);
    for (float& x : q) x = 0.1f * normal(rng);
    auto [table, pages] = store_on_shuffled_pages(*cpu, rows, keys, blocks, kBlock, 0, rng);
    // The host's dequantized rows, and each (row, head)'s log-sum-exp over them in double.
    std::vector<float> stored(keys * W);
    const KvGatherSeq seq{0, 0, static_cast<int32_t>(keys), 0};
    KvGatherArgs g;
    g.pages = pages.data(), g.block_tables = table.data(), g.max_blocks = blocks, g.seqs = &seq, g.num_seqs = 1;
    g.max_kv_len = keys, g.out = stored.data();
    ASSERT_TRUE(cpu->gather(g, {}).ok());
    const float scale = 0.07f;
    std::vector<double> want(nq * heads, -INFINITY);
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t h = 0; h < heads && kv_len[r] > 0; ++h) {
        std::vector<double> s(kv_len[r]);
        for (int64_t t = 0; t < kv_len[r]; ++t) {
          double dot = 0;
          for (int64_t i = 0; i < W; ++i) dot += double(q[(r * heads + h) * W + i]) * stored[t * W + i];
          s[t] = dot * scale;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        want[r * heads + h] = m + std::log(sum);
      }
    Dev<uint8_t> d_pages(pages);
    Dev<float> d_q(q);
    const std::vector<int32_t> query_seq(nq, 0);
    Dev<int32_t> d_table(table), d_qs(query_seq), d_kv(kv_len);
    MlaAttendShape shape;
    shape.num_queries = nq, shape.num_heads = heads, shape.max_kv_len = keys, shape.batch_invariant = true;
    shape.multiprocessor_count = 132;
    const MlaAttendPlan plan = gpu->plan_attend(shape);
    Dev<char> workspace(std::max<size_t>(plan.workspace_bytes, 1));
    for (const bool planned : {false, true}) {
      Dev<float> out(nq * heads * latent), lse(nq * heads);
      EXPECT_EQ(cudaMemset(lse.p, 0xff, nq * heads * sizeof(float)), cudaSuccess);
      MlaAttendArgs m;
      m.cache = d_pages.p, m.num_queries = nq, m.num_heads = heads, m.q = d_q.p, m.block_tables = d_table.p;
      m.max_blocks = blocks, m.query_seq = d_qs.p, m.kv_len = d_kv.p, m.scale = scale, m.out = out.p;
      m.out_lse = lse.p, m.max_kv_len = keys;
      if (planned) {
        m.num_splits = plan.num_splits, m.split_by_length = plan.split_by_length;
        m.workspace = workspace.p, m.workspace_bytes = plan.workspace_bytes;
      }
      ASSERT_TRUE(gpu->attend(m, Stream{Device::cuda(0), nullptr}).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = lse.get();
      for (int64_t i = 0; i < nq * heads; ++i) {
        if (std::isinf(want[i])) {
          EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << (planned ? "planned" : "plain") << " pair " << i << ": " << got[i];
        } else {
          EXPECT_NEAR(got[i], want[i], 1e-3 * std::max(1.0, std::fabs(want[i])))
              << (planned ? "planned" : "plain") << " pair " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::fp8mla

#include "runtime/cuda/mla_rope_cache_write.h"

namespace kiln::fp8mla {
namespace {

// The append with the MLA prologue fused (append_fusions() = norm + RoPE + queries) against the two launches it
// replaces — the core's prologue kernel finishing the rows in place, then the layout storing final rows: the same
// page bytes, the same finished queries (q roped in place, q_bf, the absorbed tail), the same roped rope part of
// the rows. Shapes: the published 512 + 64 (20 heads), NoPE 512 + 0, a partial last tile (200 + 8), five tiles
// (640 + 32); 37 rows, and 130 / 160 (the queries' prefill form, which the core's prologue takes too at that size);
// rows of ordinary, zero, tiny and huge values; a padding slot; without positions (no RoPE) and without a norm
// weight; and with q_abs null (bf16 queries only). KILN_FP8MLA_APPEND=separate turns the fusion off (and a prologue
// is then refused).
struct FusedShape {
  int64_t latent, rope, heads, nope;
  bool positions, norm;
  int64_t rows = 37;  // ≥ 128: the queries' prefill form (several heads a block, the SDK's mla_append_query_heads)
};
class Fp8MlaFusedAppend : public ::testing::TestWithParam<FusedShape> {};

TEST_P(Fp8MlaFusedAppend, StoresWhatTheCoresPrologueThenTheAppendStore) {
  load_plugins();
  const FusedShape sh = GetParam();
  auto layout = make_layout(Device::cuda(0), sh.latent, sh.rope);
  ASSERT_TRUE(layout);
  ASSERT_EQ(layout->append_fusions(), uint32_t{kKvFuseNormRope | kKvFuseQueries | kKvFuseQueriesBf16Only});
  const int64_t n = sh.rows, D = sh.latent + sh.rope, stride = D + 24, qk = sh.nope + sh.rope, H = sh.heads;
  const int64_t row_bytes = static_cast<int64_t>(layout->bytes_per_token()), blocks = (n + kBlock - 1) / kBlock + 1;
  std::mt19937 rng(static_cast<uint32_t>(sh.latent * 3 + sh.rope + H));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(n * stride), q(n * H * qk), q_abs(n * H * D, -7.0f), inv_freq(std::max<int64_t>(sh.rope / 2, 1));
  for (int64_t t = 0; t < n; ++t) {
    const float spread = t % 9 == 3 ? 0.0f : t % 9 == 5 ? 1e-30f : t % 9 == 7 ? 1e30f : std::ldexp(1.0f, t % 7 - 3);
    for (int64_t i = 0; i < stride; ++i) rows[t * stride + i] = spread * normal(rng);
  }
  for (float& v : q) v = normal(rng);
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(std::max<int64_t>(sh.rope, 1)));
  std::vector<uint16_t> norm(sh.latent);
  for (int64_t i = 0; i < sh.latent; ++i) norm[i] = static_cast<uint16_t>(0x3f80 + (i * 37) % 200 - 100);  // ≈ 0.6..1.4
  std::vector<int64_t> positions(n), slots(n);
  for (int64_t t = 0; t < n; ++t) positions[t] = 1000 + 13 * t, slots[t] = (blocks - 1 - t / kBlock) * kBlock + t % kBlock;
  slots[11] = -1;  // padding stores nothing
  const std::vector<uint8_t> zeros(static_cast<size_t>(blocks * kBlock * row_bytes), 0);
  const std::vector<uint16_t> no_bf(n * H * qk, 0);
  Dev<float> d_inv(inv_freq);
  Dev<uint16_t> d_norm(norm);
  Dev<int64_t> d_pos(positions), d_slots(slots);

  struct Out {
    std::vector<uint8_t> pages;
    std::vector<float> rows, q, q_abs;
    std::vector<uint16_t> q_bf;
  };
  const Stream stream{Device::cuda(0), nullptr};
  auto run = [&](bool fused, bool bf16_only = false) {
    Dev<float> d_rows(rows), d_q(q), d_q_abs(q_abs);
    Dev<uint16_t> d_q_bf(no_bf);
    Dev<uint8_t> d_pages(zeros);
    KvAppendArgs a;
    a.pages = d_pages.p, a.slots = d_slots.p, a.n = n, a.rows = d_rows.p, a.row_stride = stride;
    if (fused) {
      a.norm_weight = sh.norm ? d_norm.p : nullptr, a.eps = 1e-6f;
      a.positions = sh.positions ? d_pos.p : nullptr, a.inv_freq = d_inv.p, a.rope_factor = 0.75f;
      a.q = d_q.p, a.heads = H, a.nope = sh.nope, a.q_bf = d_q_bf.p, a.q_abs = bf16_only ? nullptr : d_q_abs.p;
      EXPECT_TRUE(layout->append(a, stream).ok());
    } else {
      cuda::MlaRopeCacheWrite rw;
      rw.q = d_q.p, rw.ckv = d_rows.p, rw.ckv_stride = stride, rw.n = n, rw.heads = H, rw.nope = sh.nope;
      rw.rope = sh.rope, rw.latent = sh.latent, rw.positions = sh.positions ? d_pos.p : nullptr;
      rw.inv_freq = d_inv.p, rw.attention_factor = 0.75f, rw.norm_weight = sh.norm ? d_norm.p : nullptr;
      rw.eps = 1e-6f, rw.slots = d_slots.p, rw.cache = nullptr, rw.q_bf = d_q_bf.p, rw.q_abs = d_q_abs.p;
      EXPECT_TRUE(cuda::mla_rope_cache_write(rw, nullptr).ok());
      EXPECT_TRUE(layout->append(a, stream).ok());  // final rows
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return Out{d_pages.get(), d_rows.get(), d_q.get(), d_q_abs.get(), d_q_bf.get()};
  };
  const Out separate = run(false), fused = run(true), bf16_only = run(true, true);
  // Queries in bf16 alone (kKvFuseQueriesBf16Only, a prefill-only step): the same pages and q_bf, q_abs untouched.
  EXPECT_EQ(bf16_only.pages, separate.pages);
  EXPECT_EQ(bf16_only.q_bf, separate.q_bf);
  EXPECT_EQ(bf16_only.q_abs, q_abs);
  EXPECT_EQ(fused.pages, separate.pages) << "the fused append stores other bytes";
  EXPECT_NE(fused.pages, zeros);
  EXPECT_EQ(fused.q_bf, separate.q_bf);
  EXPECT_EQ(0, std::memcmp(fused.q.data(), separate.q.data(), q.size() * sizeof(float))) << "roped q differs";
  EXPECT_EQ(0, std::memcmp(fused.q_abs.data(), separate.q_abs.data(), q_abs.size() * sizeof(float)));
  for (int64_t t = 0; t < n; ++t)  // the roped rope part, in place (the fused form leaves the latent as given)
    ASSERT_EQ(0, std::memcmp(&fused.rows[t * stride + sh.latent], &separate.rows[t * stride + sh.latent],
                             sh.rope * sizeof(float)))
        << "row " << t;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8MlaFusedAppend,
                         ::testing::Values(FusedShape{512, 64, 20, 192, true, true}, FusedShape{512, 0, 8, 128, false, true},
                                           FusedShape{200, 8, 3, 16, true, true}, FusedShape{640, 32, 5, 64, true, false},
                                           FusedShape{512, 64, 4, 128, false, true},
                                           FusedShape{512, 64, 20, 192, true, true, 160},
                                           FusedShape{640, 32, 5, 64, true, false, 130}),
                         [](const auto& info) {
                           const FusedShape& s = info.param;
                           return std::to_string(s.latent) + "_" + std::to_string(s.rope) + "_heads" +
                                  std::to_string(s.heads) + (s.positions ? "" : "_no_rope") + (s.norm ? "" : "_no_norm") +
                                  (s.rows == 37 ? "" : "_rows" + std::to_string(s.rows));
                         });

TEST(Fp8MlaFusedAppendSwitch, SeparateDeclaresNoFusionAndRefusesAPrologue) {
  load_plugins();
  ASSERT_EQ(setenv("KILN_FP8MLA_APPEND", "separate", 1), 0);
  auto layout = make_layout(Device::cuda(0), 512, 64);
  unsetenv("KILN_FP8MLA_APPEND");
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->append_fusions(), 0u);
  Dev<float> rows(576);
  Dev<int64_t> slots(std::vector<int64_t>{0});
  Dev<uint16_t> norm(512);
  Dev<uint8_t> pages(static_cast<size_t>(kBlock * 656));
  KvAppendArgs a;
  a.pages = pages.p, a.slots = slots.p, a.n = 1, a.rows = rows.p, a.norm_weight = norm.p;
  const Status s = layout->append(a, Stream{Device::cuda(0), nullptr});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("KILN_FP8MLA_APPEND=separate"), std::string::npos) << s.to_string();
  EXPECT_NE(make_layout(Device::cuda(0), 512, 64)->append_fusions(), 0u);
}

}  // namespace
}  // namespace kiln::fp8mla
