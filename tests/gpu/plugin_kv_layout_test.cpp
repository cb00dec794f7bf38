// The plugin template's `bf16-copy` KV layout (examples/plugin-template, built in-tree by tests/CMakeLists.txt into
// KILN_TEMPLATE_PLUGIN_DIR) on CUDA against the built-in `bf16`, both created through the registry as the model
// loader creates them: the same pages and gathered rows bit for bit, attention within tolerance, and the tiny
// fixture model's greedy tokens through the CUDA runner and the engine.
// Tolerances (‖Δ‖ / ‖ref‖ over a case's outputs): 1e-2 against the built-in's tensor-core kernel (latent 512 + rope 64
// without a selection), which takes q and the softmax weights into the tensor cores as bf16 (its own test holds it to
// 1e-2 against the fp32 CPU reference); 1e-4 where both sides are fp32 (the built-in's CUDA-core kernel at other
// widths and with a DSA selection, and the plugin's own host half), which differ only by summation order and expf.
#include <gtest/gtest.h>

#include "common/template_plugin.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "common/reference_fixture.h"
#include "common/test_model.h"
#include "device_buffer.h"
#include "kiln/kv_layout.h"
#include "plugin/plugin_loader.h"
#include "plugin/registry.h"

namespace kiln::test {
namespace {

constexpr double kTensorCoreTolerance = 1e-2;
constexpr double kFp32Tolerance = 1e-4;
constexpr int64_t kBlockSize = 16;

// Loads kiln-example.so into the global registry once per process.
void load_template_plugin() {
  const Status& loaded = testing::template_plugin_loaded();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string() << " (build the kiln-plugin-example target)";
}

std::shared_ptr<KvLayout> make_layout(const std::string& name, Device device, int64_t latent, int64_t rope) {
  ModelInfo info;
  info.kv_lora_rank = latent;
  info.qk_rope_head_dim = rope;
  RecipeSection kv("kv");
  kv.set("block_size", kBlockSize);
  CreateContext ctx;
  ctx.section = &kv;
  ctx.device = device;
  ctx.model = &info;
  auto made = global_registry().create<KvLayout>(name, ctx);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? *made : nullptr;
}

// Sequences of kv_lens[s] positions in shuffled pages; query rows of each at its last `rows` lengths (as the rows
// of a speculative verification); an optional DSA selection per query row.
struct Batch {
  int64_t max_blocks = 0, num_pages = 0;
  std::vector<int32_t> kv_lens, tables, query_seq, query_len, selected;
  int64_t selected_width = 0;
};

Batch make_batch(const std::vector<int32_t>& kv_lens, int rows, std::mt19937_64& rng) {
  Batch b;
  b.kv_lens = kv_lens;
  const int64_t seqs = static_cast<int64_t>(kv_lens.size());
  b.max_blocks = (*std::max_element(kv_lens.begin(), kv_lens.end()) + kBlockSize - 1) / kBlockSize;
  b.num_pages = seqs * b.max_blocks + 3;
  std::vector<int32_t> pages(b.num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  b.tables.assign(seqs * b.max_blocks, -1);
  for (int64_t s = 0, next = 0; s < seqs; ++s)
    for (int64_t blk = 0; blk * kBlockSize < kv_lens[s]; ++blk) b.tables[s * b.max_blocks + blk] = pages[next++];
  for (int64_t s = 0; s < seqs; ++s)
    for (int32_t len = std::max(1, kv_lens[s] - rows + 1); len <= kv_lens[s]; ++len) {
      b.query_seq.push_back(static_cast<int32_t>(s));
      b.query_len.push_back(len);
    }
  return b;
}

// Per query row `width` entries: up to `picks` distinct visible positions, two past kv_len (to be ignored), −1
// padding, and with `duplicates` its first pick listed again.
void add_selection(Batch& b, int64_t width, int64_t picks, bool duplicates, std::mt19937_64& rng) {
  b.selected_width = width;
  b.selected.assign(b.query_len.size() * width, -1);
  for (size_t r = 0; r < b.query_len.size(); ++r) {
    const int32_t len = b.query_len[r];
    std::vector<int32_t> pos(len);
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng);
    pos.resize(std::min<int64_t>(picks, len));
    pos.push_back(len);
    pos.push_back(len + 7);
    if (duplicates) pos.push_back(pos.front());
    std::shuffle(pos.begin(), pos.end(), rng);
    ASSERT_LE(static_cast<int64_t>(pos.size()), width);
    std::copy(pos.begin(), pos.end(), b.selected.begin() + r * width);
  }
}

// Rows (fp32, `stride` apart, not bf16-exact) for every position of every sequence, in shuffled order with padding
// rows (slot −1) among them, as the core hands final rows to a layout that fuses nothing.
struct Rows {
  std::vector<int64_t> slots;
  std::vector<float> values;
  int64_t stride = 0;
};

Rows make_rows(const Batch& b, int64_t width, std::mt19937_64& rng) {
  Rows r;
  for (size_t s = 0; s < b.kv_lens.size(); ++s)
    for (int64_t p = 0; p < b.kv_lens[s]; ++p)
      r.slots.push_back(int64_t{b.tables[s * b.max_blocks + p / kBlockSize]} * kBlockSize + p % kBlockSize);
  r.slots.insert(r.slots.end(), {-1, -1, -1});
  std::shuffle(r.slots.begin(), r.slots.end(), rng);
  r.stride = width + 5;
  r.values = random_f32(r.slots.size() * r.stride, rng, -2.f, 2.f);
  return r;
}

// The layout's pages (poisoned first) after appending `rows`.
std::unique_ptr<DeviceBuffer<uint16_t>> appended(const KvLayout& layout, const Batch& b, const Rows& rows) {
  const KvGeometry g = layout.geometry();
  auto pages = std::make_unique<DeviceBuffer<uint16_t>>(b.num_pages * kBlockSize * (g.latent_dim + g.rope_dim));
  pages->poison();
  DeviceBuffer<float> drows(rows.values);
  DeviceBuffer<int64_t> dslots(rows.slots);
  KvAppendArgs a;
  a.pages = pages->get(), a.slots = dslots.get(), a.n = static_cast<int64_t>(rows.slots.size());
  a.rows = drows.get(), a.row_stride = rows.stride;
  const Status s = layout.append(a, Stream{Device::cuda(0), nullptr});
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return pages;
}

// attend() on the device, planned as the runner plans it; `out` fp32 and `out_bf16` both written unless bf16_only.
struct AttendResult {
  std::vector<float> out;
  std::vector<uint16_t> out_bf16;
};

AttendResult attend(const KvLayout& layout, const Batch& b, const uint16_t* pages, const std::vector<float>& q,
                    int64_t heads, bool bf16_only = false) {
  const int64_t nq = static_cast<int64_t>(b.query_len.size()), L = layout.geometry().latent_dim;
  MlaAttendShape shape;
  shape.num_queries = nq, shape.num_heads = heads;
  shape.max_kv_len = *std::max_element(b.query_len.begin(), b.query_len.end());
  shape.selected_width = b.selected_width;
  cudaDeviceGetAttribute(&shape.multiprocessor_count, cudaDevAttrMultiProcessorCount, 0);
  const MlaAttendPlan plan = layout.plan_attend(shape);
  DeviceBuffer<unsigned char> workspace(std::max<size_t>(plan.workspace_bytes, 1));
  DeviceBuffer<float> dq(q), dout(nq * heads * L);
  DeviceBuffer<uint16_t> dout_bf(nq * heads * L);
  DeviceBuffer<int32_t> dtables(b.tables), dseq(b.query_seq), dlen(b.query_len);
  DeviceBuffer<int32_t> dsel(b.selected.empty() ? std::vector<int32_t>{0} : b.selected);
  dout.poison();
  dout_bf.poison();
  workspace.poison();
  MlaAttendArgs a;
  a.cache = pages, a.num_queries = nq, a.num_heads = heads, a.q = dq.get();
  a.block_tables = dtables.get(), a.max_blocks = b.max_blocks, a.query_seq = dseq.get(), a.kv_len = dlen.get();
  a.selected = b.selected.empty() ? nullptr : dsel.get(), a.selected_width = b.selected_width;
  a.scale = 0.0721f;  // 1/√192, GLM's
  a.out = bf16_only ? nullptr : dout.get(), a.out_bf16 = dout_bf.get();
  a.max_kv_len = shape.max_kv_len, a.num_splits = plan.num_splits, a.split_by_length = plan.split_by_length;
  a.workspace = workspace.get(), a.workspace_bytes = plan.workspace_bytes;
  const Status s = layout.attend(a, Stream{Device::cuda(0), nullptr});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return {bf16_only ? std::vector<float>{} : dout.download(), dout_bf.download()};
}

// The plugin's host half over a copy of the device pages: its own fp32 reference.
std::vector<float> attend_on_host(const KvLayout& cpu_layout, const Batch& b, const std::vector<uint16_t>& pages,
                                  const std::vector<float>& q, int64_t heads) {
  const int64_t nq = static_cast<int64_t>(b.query_len.size());
  std::vector<float> out(nq * heads * cpu_layout.geometry().latent_dim);
  MlaAttendArgs a;
  a.cache = pages.data(), a.num_queries = nq, a.num_heads = heads, a.q = q.data();
  a.block_tables = b.tables.data(), a.max_blocks = b.max_blocks, a.query_seq = b.query_seq.data();
  a.kv_len = b.query_len.data(), a.selected = b.selected.empty() ? nullptr : b.selected.data();
  a.selected_width = b.selected_width, a.scale = 0.0721f, a.out = out.data();
  const Status s = cpu_layout.attend(a, Stream{});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

void expect_rounded(const AttendResult& r) {
  size_t mismatched = 0;
  for (size_t i = 0; i < r.out.size(); ++i) mismatched += cpu::float_to_bf16(r.out[i]) != r.out_bf16[i];
  EXPECT_EQ(mismatched, 0u) << "out_bf16 is not out rounded to nearest even";
}

struct Geometry {
  int64_t latent, rope, heads;
};

class PluginKvLayout : public ::testing::TestWithParam<Geometry> {
 protected:
  void SetUp() override { load_template_plugin(); }
};

// Same rows appended through both layouts: identical pages, holding each row rounded to nearest even; identical
// gathered rows (bf16, the prefill path's keys); the plugin's host half gathers the same values widened.
TEST_P(PluginKvLayout, AppendAndGatherMatchTheBuiltinBitwise) {
  const Geometry geo = GetParam();
  auto builtin = make_layout("bf16", Device::cuda(0), geo.latent, geo.rope);
  auto plugin = make_layout("bf16-copy", Device::cuda(0), geo.latent, geo.rope);
  auto host = make_layout("bf16-copy", Device::cpu(), geo.latent, geo.rope);
  ASSERT_TRUE(builtin && plugin && host);
  ASSERT_EQ(plugin->bytes_per_token(), builtin->bytes_per_token());
  ASSERT_EQ(plugin->append_fusions(), 0u);
  const int64_t width = geo.latent + geo.rope;
  std::mt19937_64 rng(7);
  const Batch b = make_batch({1, 37, 100, 300}, 1, rng);
  const Rows rows = make_rows(b, width, rng);
  const std::vector<uint16_t> want_pages = appended(*builtin, b, rows)->download();
  const std::vector<uint16_t> got_pages = appended(*plugin, b, rows)->download();
  EXPECT_TRUE(want_pages == got_pages) << "the pages differ";
  size_t misrounded = 0;
  for (size_t t = 0; t < rows.slots.size(); ++t)
    for (int64_t i = 0; rows.slots[t] >= 0 && i < width; ++i)
      misrounded += got_pages[rows.slots[t] * width + i] != cpu::float_to_bf16(rows.values[t * rows.stride + i]);
  EXPECT_EQ(misrounded, 0u) << "stored values that are not the rows rounded to nearest even";

  // Sequences gathered back to back in reverse order, as the prefill path's key table.
  std::vector<KvGatherSeq> seqs;
  int32_t keys = 0;
  for (int32_t s = static_cast<int32_t>(b.kv_lens.size()) - 1; s >= 0; --s) {
    seqs.push_back(KvGatherSeq{s, keys, b.kv_lens[s], 0});
    keys += b.kv_lens[s];
  }
  DeviceBuffer<KvGatherSeq> dseqs(seqs);
  DeviceBuffer<int32_t> dtables(b.tables);
  auto gather = [&](const KvLayout& layout, const std::vector<uint16_t>& host_pages) {
    DeviceBuffer<uint16_t> pages(host_pages), out(static_cast<size_t>(keys) * width);
    out.poison();
    KvGatherArgs g;
    g.pages = pages.get(), g.block_tables = dtables.get(), g.max_blocks = b.max_blocks, g.seqs = dseqs.get();
    g.num_seqs = static_cast<int64_t>(seqs.size()), g.max_kv_len = 300, g.out = out.get();
    const Status s = layout.gather(g, Stream{Device::cuda(0), nullptr});
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out.download();
  };
  const std::vector<uint16_t> want_rows = gather(*builtin, want_pages), got_rows = gather(*plugin, got_pages);
  EXPECT_TRUE(want_rows == got_rows) << "the gathered rows differ";

  std::vector<float> host_rows(static_cast<size_t>(keys) * width);
  KvGatherArgs g;
  g.pages = got_pages.data(), g.block_tables = b.tables.data(), g.max_blocks = b.max_blocks, g.seqs = seqs.data();
  g.num_seqs = static_cast<int64_t>(seqs.size()), g.max_kv_len = 300, g.out = host_rows.data();
  const Status s = host->gather(g, Stream{});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(host_rows == widen(got_rows)) << "the host half gathers other values";
}

// Attention over the same pages: against the built-in (its fast kernel where it has one) and against the plugin's
// own host half, dense and with a DSA selection; out_bf16 is out rounded, and alone gives the same bits.
TEST_P(PluginKvLayout, AttendMatchesTheBuiltinAndTheHostHalf) {
  const Geometry geo = GetParam();
  auto builtin = make_layout("bf16", Device::cuda(0), geo.latent, geo.rope);
  auto plugin = make_layout("bf16-copy", Device::cuda(0), geo.latent, geo.rope);
  auto host = make_layout("bf16-copy", Device::cpu(), geo.latent, geo.rope);
  ASSERT_TRUE(builtin && plugin && host);
  const int64_t width = geo.latent + geo.rope;
  const bool fast = geo.latent == 512 && geo.rope == 64;
  std::mt19937_64 rng(23);
  Batch b = make_batch({1, 37, 100, 300, 1000}, 3, rng);
  const auto pages = appended(*plugin, b, make_rows(b, width, rng));
  const std::vector<uint16_t> host_pages = pages->download();
  const std::vector<float> q = random_f32(b.query_len.size() * geo.heads * width, rng);

  auto check = [&](const char* what, double builtin_tolerance) {
    SCOPED_TRACE(what);
    const AttendResult got = attend(*plugin, b, pages->get(), q, geo.heads);
    const AttendResult want = attend(*builtin, b, pages->get(), q, geo.heads);
    const std::vector<float> reference = attend_on_host(*host, b, host_pages, q, geo.heads);
    expect_rounded(got);
    const double vs_builtin = rel_error(got.out, want.out), vs_host = rel_error(got.out, reference);
    EXPECT_LT(vs_builtin, builtin_tolerance);
    EXPECT_LT(vs_host, kFp32Tolerance);
    const AttendResult alone = attend(*plugin, b, pages->get(), q, geo.heads, /*bf16_only=*/true);
    EXPECT_TRUE(alone.out_bf16 == got.out_bf16) << "out_bf16 alone differs from out_bf16 beside out";
    std::printf("%s, latent %lld + rope %lld: rel error vs built-in %.3g, vs host half %.3g\n", what,
                static_cast<long long>(geo.latent), static_cast<long long>(geo.rope), vs_builtin, vs_host);
  };
  check("dense", fast ? kTensorCoreTolerance : kFp32Tolerance);
  add_selection(b, 64, 40, false, rng);
  check("DSA selection", kFp32Tolerance);  // the built-in takes a selection through its fp32 kernel
}

// A position listed twice is one key (the SDK's CPU semantics, which the host half implements): the device half
// against the host half. (Not against the built-in's CUDA-core kernel, which weighs a repeated position twice.)
TEST_P(PluginKvLayout, RepeatedSelectedPositionsCountOnce) {
  const Geometry geo = GetParam();
  auto plugin = make_layout("bf16-copy", Device::cuda(0), geo.latent, geo.rope);
  auto host = make_layout("bf16-copy", Device::cpu(), geo.latent, geo.rope);
  ASSERT_TRUE(plugin && host);
  const int64_t width = geo.latent + geo.rope;
  std::mt19937_64 rng(31);
  Batch b = make_batch({5, 70, 300}, 2, rng);
  add_selection(b, 48, 12, true, rng);
  const auto pages = appended(*plugin, b, make_rows(b, width, rng));
  const std::vector<float> q = random_f32(b.query_len.size() * geo.heads * width, rng);
  const AttendResult got = attend(*plugin, b, pages->get(), q, geo.heads);
  EXPECT_LT(rel_error(got.out, attend_on_host(*host, b, pages->download(), q, geo.heads)), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Widths, PluginKvLayout, ::testing::Values(Geometry{512, 64, 16}, Geometry{64, 16, 8}),
                         [](const ::testing::TestParamInfo<Geometry>& i) {
                           return "latent" + std::to_string(i.param.latent) + "_rope" + std::to_string(i.param.rope);
                         });

// Teacher-forced logits rows through `m`'s step: the prompt in one step, then `tokens` one per step as the engine
// decodes them; row i is the row token i was chosen from.
std::vector<std::vector<float>> forced_rows(LoadedModel& m, const std::vector<int32_t>& prompt,
                                            const std::vector<int32_t>& tokens) {
  const int64_t total = static_cast<int64_t>(prompt.size() + tokens.size());
  testing::TestKv kv(m, total);
  std::vector<int32_t> table;
  EXPECT_TRUE(kv.reserve(table, total).ok());
  std::vector<int32_t> seq = prompt;
  std::vector<std::vector<float>> rows;
  StepOptions options;
  options.want_logits = true;
  const int64_t vocab = m.model->vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t start = i == 0 ? 0 : static_cast<int64_t>(seq.size()) - 1;
    SequenceStep step{std::span<const int32_t>(seq.data() + start, seq.size() - start), start, &table, false};
    StepOutput out;
    const Status s = m.model->step({&step, 1}, {}, kv.views(), options, out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
    rows.emplace_back(out.logits.begin(), out.logits.begin() + vocab);
    seq.push_back(tokens[i]);
  }
  return rows;
}

// The tiny fixture through the CUDA runner and the engine: bf16-copy stores what bf16 stores and attends in fp32
// as the built-in's CUDA-core kernel does at these widths (latent 32 + rope 8), so greedy tokens are identical; a
// divergence passes only at a near-tie (the built-in's top-1/top-2 gap below twice the rows' largest logits
// difference, teacher-forced on the built-in's tokens), and is reported.
TEST(PluginKvLayoutModel, TinyModelGreedyTokensMatchTheBuiltinOnTheCudaRunner) {
  constexpr int64_t kTokens = 16;
  load_template_plugin();
  auto sets = [](const std::string& layout) {
    return std::vector<std::string>{"model.path=" + testing::model_dir("glm4_moe_lite-tiny").string(),
                                    "model.device=cuda", "kv.layout=" + layout, "kv.block_size=4",
                                    "scheduler.max_model_len=256"};
  };
  LoadedModel builtin = testing::load_recipe_model(sets("bf16"));
  LoadedModel plugin = testing::load_recipe_model(sets("bf16-copy"));
  ASSERT_TRUE(builtin.on_gpu() && plugin.on_gpu());
  const std::vector<int32_t> prompt = testing::load_reference("glm4_moe_lite-tiny").ids("prompt_ids");
  auto want = testing::engine_generate(builtin, sets("bf16"), prompt, kTokens);
  auto got = testing::engine_generate(plugin, sets("bf16-copy"), prompt, kTokens);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(want->size(), static_cast<size_t>(kTokens));
  if (*got == *want) {
    std::printf("bf16-copy: %lld greedy tokens identical to bf16 through the CUDA runner\n",
                static_cast<long long>(kTokens));
    return;
  }
  const size_t k = std::mismatch(want->begin(), want->end(), got->begin(), got->end()).first - want->begin();
  const std::vector<int32_t> forced(want->begin(), want->begin() + k + 1);
  const auto want_rows = forced_rows(builtin, prompt, forced), got_rows = forced_rows(plugin, prompt, forced);
  ASSERT_EQ(want_rows.size(), k + 1);
  ASSERT_EQ(got_rows.size(), k + 1);
  const std::vector<float>& w = want_rows[k];
  const std::vector<float>& g = got_rows[k];
  double diff = 0;
  for (size_t i = 0; i < w.size(); ++i) diff = std::max(diff, std::fabs(double(w[i]) - g[i]));
  std::vector<float> top = w;
  std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
  const double gap = top[0] - top[1];
  std::printf(
      "bf16-copy diverges from bf16 at token %zu (%d vs %d): the built-in's top-1/top-2 gap %.3g, largest "
      "logits difference %.3g\n",
      k, (*got)[k], (*want)[k], gap, diff);
  EXPECT_LT(gap, 2 * diff) << "not a near-tie: token " << k << " differs";
}

}  // namespace
}  // namespace kiln::test
