// cuda::select_tokens and cuda::sample_drafts against the CPU reference (kernels/cpu/token_select.h) on identical
// inputs and uniforms.
//
// The two may part only where a uniform lands within rounding of a boundary: the device sums in another order, its
// exp may differ from the host's in the last bit (so a probability, a float, may differ by one ulp), and it measures
// the top-p mass in fixed point (error below 1e-8). The inputs here are built so that no decision is that close: each
// sampled sequence's top_p is moved until every row's cumulative mass stays 1e-7 away from it, and its uniforms are
// redrawn until every acceptance test u·q(x) < p(x) is decided by more than 1e-6 relative and every draw lands more
// than 1e-7 of the total away from the ends of the token it picks. Tokens and accepted counts must then be identical.
#include "kernels/cuda/token_select.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "device_buffer.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/token_select.h"
#include "kernels/cpu/topk.h"

namespace kiln::test {
namespace {

using cpu::SelectParams;

constexpr double kAcceptGap = 1e-6;
constexpr double kDrawGap = 1e-7;
constexpr double kMassGap = 1e-7;

enum class RowKind { kPeaked, kTies, kFlat, kMasked };

std::vector<float> make_row(int64_t vocab, RowKind kind, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1);
  std::vector<float> row(vocab);
  if (kind == RowKind::kFlat) {
    std::uniform_real_distribution<float> flat(-0.5f, 0.5f);
    for (auto& x : row) x = flat(rng);
    return row;
  }
  for (auto& x : row) x = normal(rng);
  if (kind == RowKind::kTies) {
    // Quarter steps: ties everywhere, at the top-k and top-p cuts too; and an equal maximum at a second index.
    for (auto& x : row) x = std::round(x * 4.0f) / 4.0f;
    row[any(rng)] = *std::max_element(row.begin(), row.end());
    return row;
  }
  std::uniform_real_distribution<float> boost(4.0f, 9.0f);
  for (int b = 0; b < 5; ++b) row[any(rng)] += boost(rng);
  if (kind == RowKind::kMasked) {
    const int64_t best = cpu::argmax(row.data(), vocab);
    std::bernoulli_distribution masked(0.3);
    for (int64_t i = 0; i < vocab; ++i)
      if (i != best && masked(rng)) row[i] = -std::numeric_limits<float>::infinity();
  }
  return row;
}

bool greedy(const SelectParams& p) {
  return p.temperature <= 0.0f || p.top_k == 1;
}

// The smallest distance, along the cpu::sampling_distribution nucleus loop, between the cumulative mass it compares
// and top_p (infinite when top-p is off).
double nucleus_gap(const float* logits, int64_t vocab, const SelectParams& p) {
  if (greedy(p) || !(p.top_p < 1.0f)) return INFINITY;
  const int64_t n = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  std::vector<int32_t> order(n);
  cpu::topk_indices(logits, vocab, n, order.data());
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double max_scaled = static_cast<double>(logits[order[0]]) * inv_t;
  std::vector<double> w(n);
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j)
    total += (w[j] = std::exp(static_cast<double>(logits[order[j]]) * inv_t - max_scaled));
  double mass = 0.0, gap = INFINITY;
  for (int64_t keep = 0; keep < n; ++keep) {
    if (keep > 0) {
      gap = std::min(gap, std::abs(mass - p.top_p));
      if (mass >= p.top_p) break;
    }
    mass += w[keep] / total;
  }
  return gap;
}

// How far a draw with u from `dist` lands from the ends of the token it picks, over the total.
double draw_gap(const std::vector<float>& dist, double u) {
  double total = 0.0;
  for (float x : dist) total += x;
  const double target = u * total;
  double running = 0.0;
  for (float x : dist) {
    if (x <= 0.0f) continue;
    const double before = running;
    running += x;
    if (running > target) return std::min(target - before, running - target) / total;
  }
  return 0.0;
}

double relative_gap(double a, double b) {
  if (a == b) return a == 0.0 ? INFINITY : 0.0;
  return std::abs(a - b) / std::max(a, b);
}

// One sequence before it is placed in a batch.
struct SeqData {
  SelectParams params;
  std::vector<float> rows;  // (K + 1) × vocab
  std::vector<int32_t> drafts;
  std::vector<int32_t> q_ids;  // K × q_width
  std::vector<float> q_probs;
  std::vector<double> u;  // K + 1
  int k() const { return static_cast<int>(drafts.size()); }
};

// Whether every uniform-driven decision cpu::select_tokens takes for `d` is clear of its boundary (see the top).
bool decisions_clear(const SeqData& d, int64_t vocab, int64_t q_width, const std::vector<std::vector<float>>& p) {
  const int k = d.k();
  for (int i = 0; i < k; ++i) {
    const int32_t x = d.drafts[i];
    std::vector<float> q(vocab, 0.0f);
    if (q_width == 0) q[x] = 1.0f;
    for (int64_t c = 0; c < q_width; ++c)
      if (d.q_ids[i * q_width + c] >= 0) q[d.q_ids[i * q_width + c]] = d.q_probs[i * q_width + c];
    const double lhs = d.u[i] * static_cast<double>(q[x]), rhs = p[i][x];
    if (relative_gap(lhs, rhs) < kAcceptGap) return false;
    if (lhs < rhs) continue;
    std::vector<float> residual(vocab);
    double mass = 0.0;
    for (int64_t t = 0; t < vocab; ++t) mass += (residual[t] = std::max(p[i][t] - q[t], 0.0f));
    return draw_gap(mass > 0.0 ? residual : p[i], d.u[k]) >= kDrawGap;
  }
  return draw_gap(p[k], d.u[k]) >= kDrawGap;
}

std::vector<SelectParams> settings_for(int64_t vocab) {
  const int32_t k_all_but_one = static_cast<int32_t>(vocab - 1);
  return {{0.0f, 0, 1.0f},  {1.0f, 0, 1.0f},     {0.7f, 50, 1.0f},
          {1.0f, 0, 0.9f},  {0.8f, 1000, 0.95f}, {1.3f, 0, 0.5f},
          {0.6f, 20, 0.8f}, {1.0f, 1, 1.0f},     {1.0f, k_all_but_one, 1.0f},
          {0.9f, 3, 0.3f},  {1.1f, 0, 0.99f},    {0.5f, 5000, 1.0f}};
}

// A sequence of K drafts: greedy ones match the argmax up to a random first mismatch; sampled ones come from a draft
// model close to the target (its rows plus noise) through cpu::sample_drafts, or its argmax when q_width = 0.
SeqData make_seq(int64_t vocab, int64_t q_width, int k, SelectParams params, RowKind kind, bool unlisted_draft,
                 std::mt19937_64& rng) {
  SeqData d{params};
  for (int i = 0; i <= k; ++i) {
    const auto row = make_row(vocab, kind, rng);
    d.rows.insert(d.rows.end(), row.begin(), row.end());
  }
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(vocab - 1));
  if (greedy(params)) {
    const int mismatch = static_cast<int>(rng() % (k + 1));
    for (int i = 0; i < k; ++i) {
      const int32_t best = cpu::argmax(d.rows.data() + i * vocab, vocab);
      d.drafts.push_back(
          i < mismatch ? best : (i == mismatch && vocab > 1 ? (best + 1 + any(rng) % (vocab - 1)) % vocab : any(rng)));
      // Its q row (a batch with sparse q has one per draft; greedy verification does not read it): one-hot.
      for (int64_t c = 0; c < q_width; ++c) {
        d.q_ids.push_back(c == 0 ? d.drafts.back() : -1);
        d.q_probs.push_back(c == 0 ? 1.0f : 0.0f);
      }
    }
  } else {
    std::normal_distribution<float> noise(0.0f, 0.3f);
    std::vector<float> draft_rows(d.rows.begin(), d.rows.begin() + k * vocab);
    for (auto& x : draft_rows) x += noise(rng);
    const int64_t width = std::max<int64_t>(q_width, 1);
    std::vector<float> temps(k, q_width > 0 ? 1.0f : 0.0f);
    std::vector<double> u(k);
    for (auto& x : u) x = cpu::uniform_53(rng);
    d.drafts.resize(k);
    d.q_ids.resize(k * width);
    d.q_probs.resize(k * width);
    EXPECT_TRUE(cpu::sample_drafts({draft_rows.data(), k, vocab, temps.data(), u.data(), width, d.drafts.data(),
                                    d.q_ids.data(), d.q_probs.data()})
                    .ok());
    if (q_width == 0) {
      d.q_ids.clear();
      d.q_probs.clear();
    } else if (unlisted_draft && k > 0) {
      // A draft its own q does not list: q(x) = 0, accepted iff p(x) > 0.
      const auto listed = [&](int32_t x) { return std::count(d.q_ids.begin(), d.q_ids.begin() + width, x) > 0; };
      int32_t x = any(rng);
      while (listed(x) && width < vocab) x = any(rng);
      if (!listed(x)) d.drafts[0] = x;
    }
    // Move top_p until the nucleus of every row is clear of it.
    for (int tries = 0; tries < 100; ++tries) {
      double gap = INFINITY;
      for (int i = 0; i <= k; ++i) gap = std::min(gap, nucleus_gap(d.rows.data() + i * vocab, vocab, d.params));
      if (gap >= kMassGap) break;
      d.params.top_p += 0.0071f;
      if (d.params.top_p >= 1.0f) d.params.top_p -= 0.5f;
    }
  }
  std::vector<std::vector<float>> p;
  if (!greedy(d.params)) {
    for (int i = 0; i <= k; ++i) {
      p.emplace_back(vocab);
      cpu::sampling_distribution(d.rows.data() + i * vocab, vocab,
                                 {d.params.temperature, d.params.top_k, d.params.top_p}, p.back().data());
    }
  }
  d.u.resize(k + 1);
  for (int tries = 0;; ++tries) {
    for (auto& x : d.u) x = cpu::uniform_53(rng);
    if (greedy(d.params) || decisions_clear(d, vocab, q_width, p)) break;
    EXPECT_LT(tries, 1000) << "no clear uniforms found";
    if (tries >= 1000) break;
  }
  return d;
}

// Sequences placed in memory in shuffled orders (rows, drafts with their q rows, and uniforms each in their own order,
// with unused rows between), so only the offsets tie a sequence to its data.
struct Batch {
  int64_t vocab = 0, q_width = 0, max_drafts = 0;
  std::vector<float> logits;
  std::vector<cpu::SelectSeq> seqs;
  std::vector<int32_t> drafts, q_ids;
  std::vector<float> q_probs;
  std::vector<double> uniforms;

  Batch(const std::vector<SeqData>& data, int64_t vocab_, int64_t q_width_, std::mt19937_64& rng)
      : vocab(vocab_), q_width(q_width_) {
    const size_t n = data.size();
    seqs.resize(n);
    auto shuffled = [&] {
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      return order;
    };
    for (size_t s : shuffled()) {
      const auto spare = make_row(vocab, RowKind::kFlat, rng);
      logits.insert(logits.end(), spare.begin(), spare.end());
      seqs[s].first_row = static_cast<int32_t>(logits.size() / vocab);
      logits.insert(logits.end(), data[s].rows.begin(), data[s].rows.end());
    }
    for (size_t s : shuffled()) {
      seqs[s].draft_offset = static_cast<int32_t>(drafts.size());
      drafts.insert(drafts.end(), data[s].drafts.begin(), data[s].drafts.end());
      q_ids.insert(q_ids.end(), data[s].q_ids.begin(), data[s].q_ids.end());
      q_probs.insert(q_probs.end(), data[s].q_probs.begin(), data[s].q_probs.end());
    }
    for (size_t s : shuffled()) {
      seqs[s].u_offset = static_cast<int32_t>(uniforms.size());
      uniforms.insert(uniforms.end(), data[s].u.begin(), data[s].u.end());
    }
    for (size_t s = 0; s < n; ++s) {
      seqs[s].num_drafts = data[s].k();
      seqs[s].params = data[s].params;
      max_drafts = std::max<int64_t>(max_drafts, data[s].k());
    }
  }

  int64_t width() const { return max_drafts + 1; }
};

struct Selected {
  std::vector<int32_t> tokens, accepted;
};

Selected select_on_cpu(const Batch& b) {
  Selected out{std::vector<int32_t>(b.seqs.size() * b.width()), std::vector<int32_t>(b.seqs.size())};
  const Status s =
      cpu::select_tokens({b.logits.data(), b.vocab, b.seqs.data(), static_cast<int64_t>(b.seqs.size()), b.drafts.data(),
                          b.q_width > 0 ? b.q_ids.data() : nullptr, b.q_width > 0 ? b.q_probs.data() : nullptr,
                          b.q_width, b.uniforms.data(), out.tokens.data(), out.accepted.data(), b.max_drafts});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

// The batch in device memory; run() launches on `stream` and leaves the outputs on the device.
struct DeviceBatch {
  DeviceBuffer<float> logits;
  DeviceBuffer<cpu::SelectSeq> seqs;
  DeviceBuffer<int32_t> drafts, q_ids, tokens, accepted;
  DeviceBuffer<float> q_probs;
  DeviceBuffer<double> uniforms;
  DeviceBuffer<unsigned char> workspace;
  cpu::SelectArgs args;

  explicit DeviceBatch(const Batch& b)
      : logits(b.logits),
        seqs(b.seqs),
        drafts(b.drafts),
        q_ids(b.q_ids),
        tokens(b.seqs.size() * b.width()),
        accepted(b.seqs.size()),
        q_probs(b.q_probs),
        uniforms(b.uniforms),
        workspace(cuda::select_workspace_bytes(static_cast<int64_t>(b.seqs.size()), b.max_drafts)) {
    args = {logits.get(),
            b.vocab,
            seqs.get(),
            static_cast<int64_t>(b.seqs.size()),
            drafts.get(),
            b.q_width > 0 ? q_ids.get() : nullptr,
            b.q_width > 0 ? q_probs.get() : nullptr,
            b.q_width,
            uniforms.get(),
            tokens.get(),
            accepted.get(),
            b.max_drafts};
  }
  Status run(cudaStream_t stream) { return cuda::select_tokens(args, workspace.get(), workspace.size(), stream); }
  Selected download() const { return {tokens.download(), accepted.download()}; }
};

std::string describe(const Batch& b, size_t s, const Selected& want, const Selected& got) {
  const cpu::SelectSeq& q = b.seqs[s];
  std::ostringstream o;
  o << "vocab " << b.vocab << " q_width " << b.q_width << " sequence " << s << ": K " << q.num_drafts << ", T "
    << q.params.temperature << ", top_k " << q.params.top_k << ", top_p " << q.params.top_p << "; accepted "
    << want.accepted[s] << " (cpu) vs " << got.accepted[s] << " (gpu); tokens";
  for (int64_t j = 0; j < b.width(); ++j)
    o << " " << want.tokens[s * b.width() + j] << "/" << got.tokens[s * b.width() + j];
  return o.str();
}

void expect_same(const Batch& b, const Selected& want, const Selected& got) {
  int reported = 0;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const bool same = want.accepted[s] == got.accepted[s] &&
                      std::equal(want.tokens.begin() + s * b.width(), want.tokens.begin() + (s + 1) * b.width(),
                                 got.tokens.begin() + s * b.width());
    if (!same && reported++ < 8) ADD_FAILURE() << describe(b, s, want, got);
  }
}

std::vector<SeqData> make_batch(int64_t vocab, int64_t q_width, int count, std::mt19937_64& rng) {
  const auto settings = settings_for(vocab);
  const int ks[] = {0, 1, 3, 5, 2, 4};
  std::vector<SeqData> data;
  for (int s = 0; s < count; ++s) {
    const RowKind kind = static_cast<RowKind>((s / 3 + s) % 4);
    data.push_back(make_seq(vocab, q_width, ks[s % 6], settings[s % settings.size()], kind, s % 7 == 3, rng));
  }
  // A greedy sequence with NaN logits: NaN never wins.
  SeqData nan_seq = make_seq(vocab, q_width, 2, {0.0f, 0, 1.0f}, RowKind::kPeaked, false, rng);
  for (size_t i = 0; i < nan_seq.rows.size(); i += 97) nan_seq.rows[i] = NAN;
  for (int i = 0; i < 2; ++i) nan_seq.drafts[i] = cpu::argmax(nan_seq.rows.data() + i * vocab, vocab);
  data.push_back(nan_seq);
  return data;
}

TEST(GpuTokenSelect, MatchesCpuReference) {
  std::mt19937_64 rng(2024);
  int64_t sequences = 0, accepted_drafts = 0, drafts = 0;
  for (int64_t vocab : {1000, 4099, 151552, 154880}) {
    const int count = vocab < 100000 ? 40 : 14;
    for (int64_t q_width : {0, 1, 8, 64, 256}) {
      if (vocab > 100000 && (q_width == 1 || q_width == 8)) continue;  // covered at the small sizes
      const Batch b(make_batch(vocab, q_width, count, rng), vocab, q_width, rng);
      const Selected want = select_on_cpu(b);
      DeviceBatch d(b);
      d.tokens.poison();
      d.accepted.poison();
      d.workspace.poison();
      KILN_STATUS_OK(d.run(nullptr));
      const Selected got = d.download();
      expect_same(b, want, got);
      // Bit-for-bit again, from a differently poisoned workspace.
      cudaMemset(d.workspace.get(), 0x5a, d.workspace.size());
      d.tokens.poison();
      KILN_STATUS_OK(d.run(nullptr));
      const Selected again = d.download();
      EXPECT_EQ(again.tokens, got.tokens);
      EXPECT_EQ(again.accepted, got.accepted);
      sequences += static_cast<int64_t>(b.seqs.size());
      for (size_t s = 0; s < b.seqs.size(); ++s) {
        accepted_drafts += want.accepted[s];
        drafts += b.seqs[s].num_drafts;
      }
    }
  }
  // The batches exercise both outcomes of verification.
  EXPECT_GT(accepted_drafts, drafts / 10);
  EXPECT_LT(accepted_drafts, drafts);
  std::printf("GpuTokenSelect: %lld sequences, %lld of %lld drafts accepted\n", static_cast<long long>(sequences),
              static_cast<long long>(accepted_drafts), static_cast<long long>(drafts));
}

// Greedy and plain-sampling sequences of several vocabularies' worth of rows in one launch, as the engine batches
// (K = 0 for most).
TEST(GpuTokenSelect, ManyPlainSequencesInOneLaunch) {
  std::mt19937_64 rng(77);
  const int64_t vocab = 32003;
  const auto settings = settings_for(vocab);
  std::vector<SeqData> data;
  for (int s = 0; s < 150; ++s)
    data.push_back(make_seq(vocab, 0, s % 10 == 0 ? 1 : 0, settings[s % settings.size()], static_cast<RowKind>(s % 4),
                            false, rng));
  const Batch b(data, vocab, 0, rng);
  const Selected want = select_on_cpu(b);
  DeviceBatch d(b);
  d.tokens.poison();
  KILN_STATUS_OK(d.run(nullptr));
  expect_same(b, want, d.download());
}

// sample_drafts: tokens and ids exact, probabilities to rounding (the device sums the candidates' weights in another
// order). Uniforms are redrawn until the draw is clear of a boundary.
TEST(GpuTokenSelect, DraftSamplingMatchesCpu) {
  std::mt19937_64 rng(99);
  const std::vector<float> temps = {1.0f, 0.0f, 0.7f, 1.6f, -1.0f, 0.3f, 1.0f, 2.5f};
  for (int64_t vocab : {200, 1000, 4099, 151552, 154880}) {
    for (int64_t width : {1, 7, 64, 256}) {
      const int64_t rows = static_cast<int64_t>(temps.size());
      std::vector<float> logits;
      std::vector<double> u(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = make_row(vocab, static_cast<RowKind>(r % 4), rng);
        logits.insert(logits.end(), row.begin(), row.end());
        std::vector<float> q(vocab);
        if (temps[r] > 0.0f) cpu::sampling_distribution(row.data(), vocab, {temps[r], width, 1.0f}, q.data());
        for (int tries = 0; tries < 1000; ++tries) {
          u[r] = cpu::uniform_53(rng);
          if (temps[r] <= 0.0f || draw_gap(q, u[r]) >= kDrawGap) break;
        }
      }
      std::vector<int32_t> want_tokens(rows), want_ids(rows * width);
      std::vector<float> want_probs(rows * width);
      KILN_STATUS_OK(cpu::sample_drafts({logits.data(), rows, vocab, temps.data(), u.data(), width, want_tokens.data(),
                                         want_ids.data(), want_probs.data()}));
      DeviceBuffer<float> dl(logits), dt(temps), dp(rows * width);
      DeviceBuffer<double> du(u);
      DeviceBuffer<int32_t> dtok(rows), dids(rows * width);
      dtok.poison();
      dids.poison();
      dp.poison();
      const cpu::DraftSampleArgs args{dl.get(), rows,       vocab,      dt.get(), du.get(),
                                      width,    dtok.get(), dids.get(), dp.get()};
      KILN_STATUS_OK(cuda::sample_drafts(args, nullptr));
      const auto probs = dp.download();
      EXPECT_EQ(dtok.download(), want_tokens) << "vocab " << vocab << " width " << width;
      EXPECT_EQ(dids.download(), want_ids) << "vocab " << vocab << " width " << width;
      for (size_t i = 0; i < probs.size(); ++i)
        ASSERT_NEAR(probs[i], want_probs[i], 1e-6 * want_probs[i])
            << "vocab " << vocab << " width " << width << " slot " << i;
      dp.poison();
      KILN_STATUS_OK(cuda::sample_drafts(args, nullptr));
      const auto again = dp.download();
      EXPECT_EQ(std::memcmp(again.data(), probs.data(), probs.size() * sizeof(float)), 0) << "not bit-for-bit";
    }
  }
}

// Both calls in one CUDA graph (no allocation or host synchronisation inside), replayed: the eager results.
TEST(GpuTokenSelect, CapturesInACudaGraph) {
  std::mt19937_64 rng(5);
  const int64_t vocab = 4099, width = 16;
  const Batch b(make_batch(vocab, width, 12, rng), vocab, width, rng);
  const Selected want = select_on_cpu(b);
  DeviceBatch d(b);
  const int64_t rows = 4;
  std::vector<float> logits(b.logits.begin(), b.logits.begin() + rows * vocab);
  const std::vector<float> temps = {1.0f, 0.0f, 0.8f, 1.2f};
  const std::vector<double> u = {0.25, 0.5, 0.75, 0.125};
  DeviceBuffer<float> dl(logits), dt(temps), dp(rows * width);
  DeviceBuffer<double> du(u);
  DeviceBuffer<int32_t> dtok(rows), dids(rows * width);
  const cpu::DraftSampleArgs draft_args{dl.get(), rows,       vocab,      dt.get(), du.get(),
                                        width,    dtok.get(), dids.get(), dp.get()};
  KILN_STATUS_OK(cuda::sample_drafts(draft_args, nullptr));
  const auto eager_tokens = dtok.download();
  const auto eager_ids = dids.download();

  cudaStream_t stream;
  KILN_CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  KILN_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status selected = d.run(stream);
  const Status sampled = cuda::sample_drafts(draft_args, stream);
  KILN_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  KILN_STATUS_OK(selected);
  KILN_STATUS_OK(sampled);
  cudaGraphExec_t exec;
  KILN_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    d.tokens.poison();
    d.accepted.poison();
    dtok.poison();
    dids.poison();
    KILN_CUDA_OK(cudaGraphLaunch(exec, stream));
    KILN_CUDA_OK(cudaStreamSynchronize(stream));
    expect_same(b, want, d.download());
    EXPECT_EQ(dtok.download(), eager_tokens);
    EXPECT_EQ(dids.download(), eager_ids);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuTokenSelect, RejectsBadSizes) {
  std::mt19937_64 rng(6);
  const Batch b(make_batch(1000, 8, 4, rng), 1000, 8, rng);
  DeviceBatch d(b);
  auto code = [&](auto&& edit) {
    cpu::SelectArgs a = d.args;
    size_t bytes = d.workspace.size();
    edit(a, bytes);
    return cuda::select_tokens(a, d.workspace.get(), bytes, nullptr).code();
  };
  EXPECT_EQ(code([](cpu::SelectArgs&, size_t&) {}), StatusCode::kOk);
  EXPECT_EQ(code([](cpu::SelectArgs& a, size_t&) { a.vocab = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](cpu::SelectArgs& a, size_t&) { a.q_width = 257; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](cpu::SelectArgs& a, size_t&) { a.q_probs = nullptr; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](cpu::SelectArgs& a, size_t&) { a.max_drafts = -1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](cpu::SelectArgs&, size_t& bytes) { bytes -= 1; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](cpu::SelectArgs& a, size_t& bytes) { a.num_seqs = 0, bytes = 0; }), StatusCode::kOk);

  cpu::DraftSampleArgs args{d.args.logits, 2, 1000, nullptr, nullptr, 0, nullptr, nullptr, nullptr};
  EXPECT_EQ(cuda::sample_drafts(args, nullptr).code(), StatusCode::kInvalidArgument);  // q_width 0
  args.q_width = 4;
  EXPECT_EQ(cuda::sample_drafts(args, nullptr).code(), StatusCode::kInvalidArgument);  // no temperatures
  args.rows = 0;
  EXPECT_EQ(cuda::sample_drafts(args, nullptr).code(), StatusCode::kOk);
  KILN_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kiln::test
