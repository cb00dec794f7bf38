// MLA prefill attention: the kernel against cpu::mla_attention_expanded, and the whole paged path (gather +
// kv_b expansion + kernel) against the absorbed form (cpu absorb → cuda::mla_attention_reference → cpu unabsorb)
// on the same cache.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "device_buffer.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cuda/mla_prefill.h"
#include "builtin/paged_mla_kv_layout.h"
#include "runtime/cuda/mla_prefill_attention.h"
#include "runtime/cuda/model_glue_kernels.h"

namespace kiln::test {
namespace {

// Kernel vs CPU: q, K and V are bf16-exact, so the error is the softmax weights rounded to bf16 before the value
// product plus the bf16 output. Full path vs absorbed: q, the expanded K_nope / V rounded to bf16 as well.
// Both: rel ‖Δ‖/‖ref‖ < 1e-2.
constexpr double kTolerance = 1e-2;
constexpr uint16_t kPoison = 0xffff;  // DeviceBuffer::poison: a bf16 NaN

struct SeqShape {
  int64_t q_len, kv_len;
};

struct Dims {
  int64_t heads, nope, rope, v;
};

// Query rows of sequence b start at q_row[b]; one unused row sits before every sequence, and must stay untouched.
std::vector<int64_t> query_rows(const std::vector<SeqShape>& seqs, int64_t* total_rows) {
  std::vector<int64_t> q_row;
  int64_t next = 0;
  for (const SeqShape& s : seqs) {
    q_row.push_back(next + 1);
    next += 1 + s.q_len;
  }
  *total_rows = next;
  return q_row;
}

// Checks the sequences' rows of `got` (bf16 [rows, H, v]) against `want` (the same rows, packed) and that the gap
// rows still hold the poison; returns the relative error.
double compare_rows(const std::vector<uint16_t>& got, const std::vector<float>& want, const std::vector<SeqShape>& seqs,
                    const std::vector<int64_t>& q_row, int64_t total_rows, int64_t row_width) {
  std::vector<float> got_rows;
  std::vector<char> used(total_rows, 0);
  for (size_t b = 0; b < seqs.size(); ++b)
    for (int64_t i = 0; i < seqs[b].q_len; ++i) {
      used[q_row[b] + i] = 1;
      for (int64_t k = 0; k < row_width; ++k) got_rows.push_back(cpu::bf16_to_float(got[(q_row[b] + i) * row_width + k]));
    }
  int64_t overwritten = 0;
  for (int64_t r = 0; r < total_rows; ++r)
    if (!used[r])
      for (int64_t k = 0; k < row_width; ++k) overwritten += got[r * row_width + k] != kPoison;
  EXPECT_EQ(overwritten, 0) << "values written outside the sequences' rows";
  return rel_error(got_rows, want);
}

void run_kernel_case(const Dims& d, const std::vector<SeqShape>& seqs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t H = d.heads, qk = d.nope + d.rope, kvw = d.nope + d.v, rope_pitch = d.rope + 8;
  int64_t rows = 0;
  const std::vector<int64_t> q_row = query_rows(seqs, &rows);
  std::vector<cuda::MlaPrefillSeq> table;
  int64_t keys = 0, max_q = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    table.push_back({int32_t(q_row[b]), int32_t(seqs[b].q_len), int32_t(keys), int32_t(seqs[b].kv_len)});
    keys += seqs[b].kv_len;
    max_q = std::max(max_q, seqs[b].q_len);
  }
  const Bf16Data q = random_bf16(size_t(rows * H * qk), rng);
  const Bf16Data kv = random_bf16(size_t(keys * H * kvw), rng);        // [keys, H, nope | v]
  const Bf16Data k_rope = random_bf16(size_t(keys * rope_pitch), rng);  // [keys, 8 unused | rope]
  const float scale = 0.25f;

  std::vector<float> want;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t ql = seqs[b].q_len, kl = seqs[b].kv_len, k0 = table[b].key_start;
    std::vector<float> k(kl * H * qk), v(kl * H * d.v), o(ql * H * d.v);
    for (int64_t t = 0; t < kl; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* src = kv.values.data() + ((k0 + t) * H + h) * kvw;
        std::copy(src, src + d.nope, k.data() + (t * H + h) * qk);
        std::copy(k_rope.values.data() + (k0 + t) * rope_pitch + 8, k_rope.values.data() + (k0 + t + 1) * rope_pitch,
                  k.data() + (t * H + h) * qk + d.nope);
        std::copy(src + d.nope, src + kvw, v.data() + (t * H + h) * d.v);
      }
    cpu::mla_attention_expanded(q.values.data() + q_row[b] * H * qk, k.data(), v.data(), ql, kl, H, qk, d.v, scale,
                                nullptr, 0, o.data());
    want.insert(want.end(), o.begin(), o.end());
  }

  DeviceBuffer<uint16_t> dq(q.bits);
  DeviceBuffer<uint16_t> dkv(kv.bits), drope(k_rope.bits), dout(size_t(rows * H * d.v));
  DeviceBuffer<cuda::MlaPrefillSeq> dseqs(table);
  cuda::MlaPrefillParams p;
  p.q = dq.get(), p.q_row_stride = H * qk;
  p.k_nope = dkv.get(), p.k_nope_key_stride = H * kvw, p.k_nope_head_stride = kvw;
  p.k_rope = drope.get() + 8, p.k_rope_key_stride = rope_pitch;
  p.v = dkv.get() + d.nope, p.v_key_stride = H * kvw, p.v_head_stride = kvw;
  p.out = dout.get(), p.out_row_stride = H * d.v;
  p.seqs = dseqs.get(), p.num_seqs = static_cast<int64_t>(seqs.size()), p.max_q_len = max_q, p.total_keys = keys;
  p.num_heads = H, p.nope_dim = d.nope, p.rope_dim = d.rope, p.v_dim = d.v, p.scale = scale;
  // The kernel the device dispatches (the wgmma form on compute capability 9.0), then the mma.sync form forced;
  // each in every block order (heads first, head-major, heads in groups of 1, 3 and 7 — the last group smaller
  // where 3 or 7 does not divide H), which must give the same bits.
  struct Order {
    bool heads_fastest;
    int64_t head_group;
  };
  for (const bool use_wgmma : {true, false}) {
    std::vector<uint16_t> first;
    for (const Order order : {Order{true, 0}, Order{false, 0}, Order{true, 1}, Order{true, 3}, Order{false, 7}}) {
      dout.poison();
      p.use_wgmma = use_wgmma, p.heads_fastest = order.heads_fastest, p.head_group = order.head_group;
      KILN_STATUS_OK(cuda::mla_prefill_bf16(p, nullptr));
      KILN_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = dout.download();
      if (order.heads_fastest && order.head_group == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << "block order (heads first " << order.heads_fastest << ", head group "
                              << order.head_group << ") gives other bits";
        continue;
      }
      const double err = compare_rows(got, want, seqs, q_row, rows, H * d.v);
      std::printf("  kernel%s H=%lld nope=%lld rope=%lld v=%lld: rel err %.3g\n", use_wgmma ? "" : " (mma.sync)",
                  (long long)H, (long long)d.nope, (long long)d.rope, (long long)d.v, err);
      EXPECT_LT(err, kTolerance) << "H " << H << " nope " << d.nope << " rope " << d.rope << " v " << d.v
                                 << (use_wgmma ? "" : " mma.sync");
    }
  }
}

TEST(GpuMlaPrefill, GlmKernelMatchesCpu) {
  run_kernel_case({20, 192, 64, 256}, {{130, 1000}, {7, 7}, {1, 300}, {200, 263}}, 1);
  run_kernel_case({20, 192, 64, 256}, {{129, 129}}, 2);
}

// Long enough that the online softmax rescales across many tiles and both ring buffers turn over often.
TEST(GpuMlaPrefill, GlmKernelMatchesCpuLongContext) {
  run_kernel_case({2, 192, 64, 256}, {{300, 6001}, {65, 65}}, 6);
}

TEST(GpuMlaPrefill, DeepSeekKernelMatchesCpu) {
  run_kernel_case({16, 128, 64, 128}, {{129, 129}, {64, 1000}, {1, 1}, {7, 70}}, 3);
}

TEST(GpuMlaPrefill, GenericDimsMatchCpu) {
  run_kernel_case({4, 16, 8, 16}, {{7, 20}, {130, 130}, {1, 65}}, 4);
  run_kernel_case({4, 32, 16, 32}, {{130, 700}, {3, 3}}, 5);
}

struct PathCase {
  Dims d;
  int64_t latent;
  int64_t block_size;
  std::vector<SeqShape> seqs;
};

// The paged path against the absorbed form: q_lat = W_UKᵀ q_nope, attention over the latent cache, out = W_UV o_lat.
// The built-in bf16 KV layout on CUDA, which the prefill path gathers cached rows through.
std::unique_ptr<KvLayout> bf16_layout(int64_t latent, int64_t rope, int64_t block_size) {
  ModelInfo info;
  info.kv_lora_rank = latent;
  info.qk_rope_head_dim = rope;
  RecipeSection kv("kv");
  kv.set("block_size", block_size);
  CreateContext ctx;
  ctx.section = &kv;
  ctx.device = Device::cuda(0);
  ctx.model = &info;
  auto made = builtin::create_bf16_kv_layout_cuda(ctx);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return std::move(made).value();
}

void run_path_case(const PathCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Dims& d = c.d;
  const int64_t H = d.heads, qk = d.nope + d.rope, L = c.latent, D = L + d.rope, bs = c.block_size;
  const int64_t n = static_cast<int64_t>(c.seqs.size());
  int64_t rows = 0;
  const std::vector<int64_t> q_row = query_rows(c.seqs, &rows);
  int64_t max_kv = 0, total_keys = 0, packed_rows = 0;
  for (const SeqShape& s : c.seqs) max_kv = std::max(max_kv, s.kv_len), total_keys += s.kv_len, packed_rows += s.q_len;
  const int64_t max_blocks = (max_kv + bs - 1) / bs + 1;
  // Sequence b uses table row n − 1 − b; pages handed out shuffled.
  const int64_t pages = n * max_blocks;
  std::vector<int32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  std::vector<int32_t> tables(n * max_blocks, -1);
  for (int64_t b = 0, next = 0; b < n; ++b)
    for (int64_t blk = 0; blk * bs < c.seqs[b].kv_len; ++blk) tables[(n - 1 - b) * max_blocks + blk] = page_ids[next++];
  const Bf16Data cache = random_bf16(size_t(pages * bs * D), rng);
  const Bf16Data kv_b = random_bf16(size_t(H * (d.nope + d.v) * L), rng, -0.1f, 0.1f);
  const Bf16Data q_data = random_bf16(size_t(rows * H * qk), rng);  // the kernel takes bf16 queries
  const std::vector<float>& q = q_data.values;
  const float scale = 0.3f;

  // Absorbed reference over the packed rows.
  std::vector<float> q_packed, q_abs(packed_rows * H * D);
  std::vector<int32_t> ref_seq, ref_len;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < c.seqs[b].q_len; ++i) {
      q_packed.insert(q_packed.end(), q.begin() + (q_row[b] + i) * H * qk, q.begin() + (q_row[b] + i + 1) * H * qk);
      ref_seq.push_back(int32_t(n - 1 - b));
      ref_len.push_back(int32_t(c.seqs[b].kv_len - c.seqs[b].q_len + i + 1));
    }
  const cpu::MlaAbsorbDims ad{H, d.nope, d.v, L};
  cpu::mla_absorb_query(q_packed.data(), packed_rows, qk, kv_b.values.data(), ad, q_abs.data(), D);
  for (int64_t r = 0; r < packed_rows * H; ++r)
    std::copy(q_packed.begin() + r * qk + d.nope, q_packed.begin() + (r + 1) * qk, q_abs.begin() + r * D + L);
  DeviceBuffer<float> dq_abs(q_abs), dscores(size_t(packed_rows * H * max_kv)), do_lat(size_t(packed_rows * H * L));
  DeviceBuffer<uint16_t> dcache(cache.bits);
  DeviceBuffer<int32_t> dtables(tables), dref_seq(ref_seq), dref_len(ref_len);
  cuda::MlaReferenceParams rp;
  rp.q = dq_abs.get(), rp.rows = packed_rows, rp.heads = H, rp.latent_dim = L, rp.rope_dim = d.rope;
  rp.cache = dcache.get(), rp.block_size = bs, rp.block_tables = dtables.get(), rp.max_blocks = max_blocks;
  rp.query_seq = dref_seq.get(), rp.kv_len = dref_len.get(), rp.max_kv_len = max_kv, rp.scale = scale;
  rp.scores = dscores.get(), rp.out = do_lat.get();
  KILN_STATUS_OK(cuda::mla_attention_reference(rp, nullptr));
  const std::vector<float> o_lat = do_lat.download();
  std::vector<float> want(packed_rows * H * d.v);
  cpu::mla_unabsorb_output(o_lat.data(), packed_rows, kv_b.values.data(), ad, want.data());

  // The prefill path on the same cache.
  std::vector<cuda::MlaPrefillSequence> seqs;
  for (int64_t b = 0; b < n; ++b) seqs.push_back({q_row[b], c.seqs[b].q_len, c.seqs[b].kv_len, n - 1 - b});
  const cuda::MlaPrefillDims dims{H, d.nope, d.rope, d.v, L};
  const size_t ws_bytes = cuda::mla_prefill_workspace_bytes(n, total_keys, dims);
  DeviceBuffer<uint16_t> dq(q_data.bits);
  DeviceBuffer<uint16_t> dkv_b(kv_b.bits), dout(size_t(rows * H * d.v));
  DeviceBuffer<unsigned char> ws(ws_bytes);
  dout.poison();
  ws.poison();
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  auto layout = bf16_layout(L, d.rope, bs);
  cuda::MlaPrefillArgs a;
  a.seqs = seqs, a.dims = dims, a.q = dq.get(), a.layout = layout.get(), a.pages = dcache.get(), a.block_size = bs;
  a.stream = Stream{Device::cuda(0), nullptr};
  a.block_tables = dtables.get(), a.max_blocks = max_blocks, a.kv_b = dkv_b.get(), a.scale = scale;
  a.out = dout.get(), a.workspace = ws.get(), a.workspace_bytes = ws_bytes;
  const Status st = cuda::mla_prefill_attention(a, blas, nullptr);
  cudaDeviceSynchronize();
  cublasDestroy(blas);
  KILN_STATUS_OK(st);
  const double err = compare_rows(dout.download(), want, c.seqs, q_row, rows, H * d.v);
  std::printf("  path H=%lld nope=%lld rope=%lld v=%lld L=%lld: rel err %.3g\n", (long long)H, (long long)d.nope,
              (long long)d.rope, (long long)d.v, (long long)L, err);
  EXPECT_LT(err, kTolerance) << "H " << H << " nope " << d.nope << " L " << L;
}

TEST(GpuMlaPrefill, PagedPathMatchesAbsorbedGlm) {
  run_path_case({{20, 192, 64, 256}, 512, 64, {{130, 400}, {7, 7}, {1, 50}}}, 11);
}

TEST(GpuMlaPrefill, PagedPathMatchesAbsorbedDeepSeekAndTiny) {
  run_path_case({{8, 128, 64, 128}, 512, 16, {{70, 1000}, {33, 33}}}, 12);
  run_path_case({{4, 16, 8, 16}, 32, 16, {{9, 40}, {130, 130}, {2, 2}}}, 13);   // the tiny fixtures' dims
  run_path_case({{3, 16, 6, 12}, 30, 8, {{5, 17}}}, 14);                         // rows of 36 values: scalar gather
}

// Tensor parallelism: a rank runs the path over its heads (its rows of kv_b, its heads of q), and each head's output
// must be bitwise the one-rank output's (CUDA TP greedy = TP=1). The kv_b expansion's GEMM is as wide as the rank's
// heads, so its per-element sums must not depend on that width.
void run_head_shard_case(const PathCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Dims& d = c.d;
  const int64_t H = d.heads, qk = d.nope + d.rope, L = c.latent, D = L + d.rope, bs = c.block_size;
  const int64_t n = static_cast<int64_t>(c.seqs.size());
  int64_t rows = 0;
  const std::vector<int64_t> q_row = query_rows(c.seqs, &rows);
  int64_t max_kv = 0, total_keys = 0;
  for (const SeqShape& s : c.seqs) max_kv = std::max(max_kv, s.kv_len), total_keys += s.kv_len;
  const int64_t max_blocks = (max_kv + bs - 1) / bs;
  std::vector<int32_t> tables(n * max_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  const Bf16Data cache = random_bf16(size_t(n * max_blocks * bs * D), rng);
  const Bf16Data kv_b = random_bf16(size_t(H * (d.nope + d.v) * L), rng, -0.1f, 0.1f);
  const Bf16Data q_data = random_bf16(size_t(rows * H * qk), rng);  // the kernel takes bf16 queries
  std::vector<cuda::MlaPrefillSequence> seqs;
  for (int64_t b = 0; b < n; ++b) seqs.push_back({q_row[b], c.seqs[b].q_len, c.seqs[b].kv_len, b});
  DeviceBuffer<uint16_t> dcache(cache.bits), dkv_b(kv_b.bits);
  DeviceBuffer<int32_t> dtables(tables);
  auto layout = bf16_layout(L, d.rope, bs);
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  // Heads [h0, h0 + hs): q's rows of those heads, kv_b's rows from head h0 on; returns bf16 [rows, hs, v].
  auto run = [&](int64_t h0, int64_t hs) {
    std::vector<uint16_t> q_part;
    for (int64_t r = 0; r < rows; ++r)
      q_part.insert(q_part.end(), q_data.bits.begin() + (r * H + h0) * qk, q_data.bits.begin() + (r * H + h0 + hs) * qk);
    const cuda::MlaPrefillDims dims{hs, d.nope, d.rope, d.v, L};
    const size_t ws_bytes = cuda::mla_prefill_workspace_bytes(n, total_keys, dims);
    DeviceBuffer<uint16_t> dq(q_part);
    DeviceBuffer<uint16_t> dout(size_t(rows * hs * d.v));
    DeviceBuffer<unsigned char> ws(ws_bytes);
    dout.poison();
    cuda::MlaPrefillArgs a;
    a.seqs = seqs, a.dims = dims, a.q = dq.get(), a.layout = layout.get(), a.pages = dcache.get(), a.block_size = bs;
    a.stream = Stream{Device::cuda(0), nullptr};
    a.block_tables = dtables.get(), a.max_blocks = max_blocks, a.kv_b = dkv_b.get() + h0 * (d.nope + d.v) * L;
    a.scale = 0.3f, a.out = dout.get(), a.workspace = ws.get(), a.workspace_bytes = ws_bytes;
    const Status st = cuda::mla_prefill_attention(a, blas, nullptr);
    EXPECT_TRUE(st.ok()) << st.to_string();
    cudaDeviceSynchronize();
    return dout.download();
  };
  const std::vector<uint16_t> whole = run(0, H);
  for (int parts : {2, 3}) {
    if (parts > H) continue;
    for (int r = 0; r < parts; ++r) {
      const int64_t h0 = H * r / parts, hs = H * (r + 1) / parts - h0;
      const std::vector<uint16_t> part = run(h0, hs);
      int64_t differ = 0;
      for (size_t b = 0; b < c.seqs.size(); ++b)
        for (int64_t i = 0; i < c.seqs[b].q_len; ++i)
          for (int64_t h = 0; h < hs; ++h)
            for (int64_t k = 0; k < d.v; ++k)
              differ += part[((q_row[b] + i) * hs + h) * d.v + k] != whole[((q_row[b] + i) * H + h0 + h) * d.v + k];
      EXPECT_EQ(differ, 0) << "H " << H << " L " << L << ": heads " << h0 << ".." << h0 + hs << " of " << parts
                           << " ranks differ from the one-rank path in " << differ << " values";
    }
  }
  cublasDestroy(blas);
}

TEST(GpuMlaPrefill, EachHeadIsBitwiseTheSameOnATensorParallelRank) {
  run_head_shard_case({{8, 32, 16, 32}, 128, 16, {{17, 17}}}, 21);                  // models/tiny-glm, its prompt
  run_head_shard_case({{8, 32, 16, 32}, 128, 16, {{40, 100}, {3, 3}}}, 22);
  run_head_shard_case({{4, 16, 8, 16}, 32, 16, {{9, 40}, {2, 2}}}, 23);             // the tiny fixtures' dims
  run_head_shard_case({{20, 192, 64, 256}, 512, 64, {{130, 400}, {7, 7}}}, 24);    // GLM-4.7-Flash
  run_head_shard_case({{20, 192, 64, 256}, 512, 64, {{2000, 2000}}}, 25);
}

// Layer-major prefill (cuda_mla_moe_model.cpp): one prompt's rows [start, end) in tiles whose boundaries are multiples
// of `tile`, each call over one workspace laid out for `end` keys, the first gathering and expanding keys 0 .. its end
// and each later one only its own keys (keys_ready). Each tile's rows must match one call over the whole prompt (the
// same arithmetic, the expansion GEMMs' shapes aside: within kTolerance; the bitwise differences are reported).
void run_tiled_case(const Dims& d, int64_t L, int64_t bs, int64_t start, int64_t end, int64_t tile, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t H = d.heads, qk = d.nope + d.rope, D = L + d.rope, rows = end - start;
  const int64_t max_blocks = (end + bs - 1) / bs;
  std::vector<int32_t> tables(max_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  const Bf16Data cache = random_bf16(size_t(max_blocks * bs * D), rng);
  const Bf16Data kv_b = random_bf16(size_t(H * (d.nope + d.v) * L), rng, -0.1f, 0.1f);
  const Bf16Data q_data = random_bf16(size_t(rows * H * qk), rng);
  const cuda::MlaPrefillDims dims{H, d.nope, d.rope, d.v, L};
  const size_t ws_bytes = cuda::mla_prefill_workspace_bytes(1, end, dims);
  DeviceBuffer<uint16_t> dcache(cache.bits), dkv_b(kv_b.bits), dq(q_data.bits);
  DeviceBuffer<int32_t> dtables(tables);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  auto layout = bf16_layout(L, d.rope, bs);
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  auto call = [&](std::vector<cuda::MlaPrefillSequence> seqs, int64_t ready, uint16_t* out) {
    cuda::MlaPrefillArgs a;
    a.seqs = seqs, a.dims = dims, a.q = dq.get(), a.layout = layout.get(), a.pages = dcache.get(), a.block_size = bs;
    a.stream = Stream{Device::cuda(0), nullptr};
    a.block_tables = dtables.get(), a.max_blocks = max_blocks, a.kv_b = dkv_b.get(), a.scale = 0.3f, a.out = out;
    a.workspace = ws.get(), a.workspace_bytes = ws_bytes, a.key_capacity = end, a.keys_ready = ready;
    return cuda::mla_prefill_attention(a, blas, nullptr);
  };
  DeviceBuffer<uint16_t> whole_out(size_t(rows * H * d.v)), tiled_out(size_t(rows * H * d.v));
  whole_out.poison();
  tiled_out.poison();
  ws.poison();
  KILN_STATUS_OK(call({{0, rows, end, 0}}, 0, whole_out.get()));
  ws.poison();  // the tiles must not lean on what the whole call left
  int64_t tiles = 0;
  for (int64_t r = 0; r < rows; ++tiles) {
    const int64_t stop = std::min(end, ((start + r) / tile + 1) * tile) - start;
    KILN_STATUS_OK(call({{r, stop - r, start + stop, 0}}, r > 0 ? start + r : 0, tiled_out.get()));
    r = stop;
  }
  cudaDeviceSynchronize();
  cublasDestroy(blas);
  const std::vector<uint16_t> w = whole_out.download(), t = tiled_out.download();
  std::vector<float> want(w.size());
  int64_t differ = 0;
  for (size_t i = 0; i < w.size(); ++i) want[i] = cpu::bf16_to_float(w[i]), differ += w[i] != t[i];
  const double err = compare_rows(t, want, {{rows, end}}, {0}, rows, H * d.v);
  std::printf("  tiled H=%lld L=%lld keys %lld..%lld in %lld tiles of %lld: rel err %.3g, %lld of %zu values differ "
              "bitwise\n", (long long)H, (long long)L, (long long)start, (long long)end, (long long)tiles, (long long)tile,
              err, (long long)differ, w.size());
  EXPECT_GT(tiles, 2);
  EXPECT_LT(err, kTolerance);
}

TEST(GpuMlaPrefill, TilesOverOneWorkspaceMatchOneCall) {
  run_tiled_case({20, 192, 64, 256}, 512, 64, 64, 764, 256, 31);  // GLM-4.7-Flash, one cached block first
  run_tiled_case({8, 128, 64, 128}, 512, 16, 0, 300, 96, 32);     // DeepSeek-V3
  run_tiled_case({4, 16, 8, 16}, 32, 16, 16, 130, 48, 33);        // the tiny fixtures' dims, a short last tile
}

TEST(GpuMlaPrefill, RejectsTilesItCannotContinue) {
  const cuda::MlaPrefillDims dims{4, 16, 8, 16, 32};
  const size_t ws_bytes = cuda::mla_prefill_workspace_bytes(2, 64, dims);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  DeviceBuffer<uint16_t> q(40 * 4 * 24), pages(64 * 40), kv_b(4 * 32 * 32), out(40 * 4 * 16);
  DeviceBuffer<int32_t> tables(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  auto layout = bf16_layout(32, 8, 8);
  auto call = [&](std::vector<cuda::MlaPrefillSequence> seqs, int64_t capacity, int64_t ready) {
    cuda::MlaPrefillArgs a;
    a.seqs = seqs, a.dims = dims, a.q = q.get(), a.layout = layout.get(), a.pages = pages.get(), a.block_size = 8;
    a.block_tables = tables.get(), a.stream = Stream{Device::cuda(0), nullptr}, a.max_blocks = 8;
    a.kv_b = kv_b.get(), a.out = out.get(), a.workspace = ws.get(), a.workspace_bytes = ws_bytes;
    a.key_capacity = capacity, a.keys_ready = ready;
    return cuda::mla_prefill_attention(a, nullptr, nullptr).code();
  };
  EXPECT_EQ(call({{0, 20, 40, 0}}, 32, 0), StatusCode::kInvalidArgument);           // capacity below the keys
  EXPECT_EQ(call({{0, 20, 40, 0}}, 64, 12), StatusCode::kInvalidArgument);          // not a whole block
  EXPECT_EQ(call({{0, 20, 40, 0}}, 64, 40), StatusCode::kInvalidArgument);          // nothing left to add
  EXPECT_EQ(call({{0, 8, 16, 0}, {8, 8, 16, 0}}, 64, 8), StatusCode::kInvalidArgument);  // two sequences
}

TEST(GpuMlaPrefill, RejectsSmallWorkspace) {
  const std::vector<cuda::MlaPrefillSequence> seqs{{0, 4, 10, 0}};
  const cuda::MlaPrefillDims dims{4, 16, 8, 16, 32};
  DeviceBuffer<unsigned char> ws(64);
  DeviceBuffer<uint16_t> q(4 * 4 * 24);
  DeviceBuffer<uint16_t> pages(64 * 40), kv_b(4 * 32 * 32), out(4 * 4 * 16);
  DeviceBuffer<int32_t> tables(std::vector<int32_t>{0, 1});
  auto layout = bf16_layout(32, 8, 8);
  cuda::MlaPrefillArgs a;
  a.seqs = seqs, a.dims = dims, a.q = q.get(), a.layout = layout.get(), a.pages = pages.get(), a.block_size = 8;
  a.block_tables = tables.get(), a.stream = Stream{Device::cuda(0), nullptr};
  a.max_blocks = 2, a.kv_b = kv_b.get(), a.out = out.get(), a.workspace = ws.get(), a.workspace_bytes = 64;
  const Status st = cuda::mla_prefill_attention(a, nullptr, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

}  // namespace
}  // namespace kiln::test
