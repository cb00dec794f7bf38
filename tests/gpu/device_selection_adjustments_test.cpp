// The CUDA token selection (runtime/cuda/cuda_token_selection) against the host's (select_tokens_host) on the same
// logits and uniforms: logit adjustments (logit_bias, repetition on positive and negative logits, presence /
// frequency adds), grammar masks, min_p, greedy and sampled selection, drafts verified with each row's own
// adjustments, and logprobs — on a 151552-token vocabulary (GLM's) and a small one.
//
// Expected agreement: adjustments and the min_p threshold are formed with the host's roundings (no fused
// multiply-add; the threshold's offset computed on the host), so greedy and verified tokens are identical; sampled
// tokens are identical unless a uniform lands within about 1e-7 of a boundary (kernels/cuda/token_select.h), which
// the few draws here do not (fixed seeds). Logprobs: within 1e-4 absolute (the device sums exp in another order;
// measured error is around 1e-12); top-N ids identical, ties broken by the lower id on both (token_logprobs'
// comparator; topk.cu's order key), which the quarter-step rows below exercise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "device_buffer.h"
#include "kernels/cpu/token_select.h"
#include "model/host_token_select.h"
#include "runtime/cuda/cuda_token_selection.h"

namespace kiln::test {
namespace {

constexpr double kLogprobTolerance = 1e-4;

// One entry of a step: its selection and the host-side storage the selection's spans point into.
struct Entry {
  TokenSelection sel;
  std::vector<int32_t> drafts;
  std::vector<LogitAdjustment> adjustments;
  std::vector<int32_t> offsets;
  std::vector<uint32_t> allowed;
  void bind() {
    sel.drafts = drafts;
    sel.num_drafts = static_cast<int32_t>(drafts.size());
    sel.adjustments = adjustments;
    sel.adjustment_offsets = offsets;
    sel.allowed = allowed;
  }
};

struct Outcome {
  StepOutput host, device;
};

// Runs `entries` (rows laid out one after the other) through both selections.
Outcome run_both(const std::vector<float>& logits, int64_t vocab, std::vector<Entry>& entries) {
  std::vector<TokenSelection> select;
  std::vector<int64_t> first_row;
  int64_t row = 0;
  for (Entry& e : entries) {
    e.bind();
    select.push_back(e.sel);
    first_row.push_back(row);
    row += e.sel.num_drafts + 1;
  }
  EXPECT_EQ(static_cast<int64_t>(logits.size()), row * vocab);
  Outcome o;
  const Status hs = select_tokens_host(logits.data(), vocab, first_row, select, o.host);
  EXPECT_TRUE(hs.ok()) << hs.to_string();
  DeviceBuffer<float> d_logits(logits);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cuda::DeviceTokenSelection selection;
  const Status ds = selection.select(d_logits.get(), vocab, first_row, select, stream, o.device);
  EXPECT_TRUE(ds.ok()) << ds.to_string();
  cudaStreamDestroy(stream);
  return o;
}

void expect_same(const Outcome& o, const std::vector<Entry>& entries) {
  ASSERT_EQ(o.device.tokens.size(), o.host.tokens.size());
  for (size_t i = 0; i < o.host.tokens.size(); ++i) {
    EXPECT_EQ(o.device.tokens[i], o.host.tokens[i]) << "entry " << i;
    EXPECT_EQ(o.device.accepted[i], o.host.accepted[i]) << "entry " << i;
  }
  ASSERT_EQ(o.device.logprobs.size(), o.host.logprobs.size());
  for (size_t i = 0; i < o.host.logprobs.size(); ++i) {
    ASSERT_EQ(o.device.logprobs[i].size(), o.host.logprobs[i].size()) << "entry " << i;
    if (entries[i].sel.logprobs >= 0) ASSERT_EQ(o.host.logprobs[i].size(), o.host.tokens[i].size()) << "entry " << i;
    for (size_t t = 0; t < o.host.logprobs[i].size(); ++t) {
      const TokenLogprobs& h = o.host.logprobs[i][t];
      const TokenLogprobs& d = o.device.logprobs[i][t];
      EXPECT_NEAR(d.logprob, h.logprob, kLogprobTolerance) << "entry " << i << " token " << t;
      ASSERT_EQ(d.top.size(), h.top.size()) << "entry " << i << " token " << t;
      for (size_t k = 0; k < h.top.size(); ++k) {
        EXPECT_EQ(d.top[k].first, h.top[k].first) << "entry " << i << " token " << t << " rank " << k;
        EXPECT_NEAR(d.top[k].second, h.top[k].second, kLogprobTolerance) << "entry " << i << " token " << t;
      }
    }
  }
}

std::vector<float> random_rows(int64_t rows, int64_t vocab, std::mt19937_64& rng, bool quarter_steps = false) {
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> v(rows * vocab);
  for (float& x : v) x = quarter_steps ? std::round(normal(rng) * 4.0f) / 4.0f : normal(rng);
  return v;
}

int32_t argmax(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}
int32_t argmin(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::min_element(row, row + vocab) - row);
}

// A row's adjustments as the engine makes them (distinct tokens) but in no particular order: a low token lifted
// above the top, the top token under a repetition penalty (positive logit), negative logits under it too, and
// presence / frequency adds on a few more.
std::vector<LogitAdjustment> row_adjustments(const float* row, int64_t vocab, std::mt19937_64& rng) {
  std::vector<LogitAdjustment> a;
  const int32_t top = argmax(row, vocab), low = argmin(row, vocab);
  const float span = row[top] - row[low];
  a.push_back({low, span + 3.0f, 1.0f, 0.0f});  // logit_bias making the lowest token win (others get ≤ 1.5)
  a.push_back({top, 0.0f, 1.3f, -0.4f});          // repetition on a positive logit, then a frequency add
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(vocab - 1));
  for (int k = 0; k < 24; ++k) {
    const int32_t t = any(rng);
    if (t == top || t == low || std::any_of(a.begin(), a.end(), [&](const LogitAdjustment& x) { return x.token == t; }))
      continue;
    LogitAdjustment x{t, 0.0f, 1.0f, 0.0f};
    if (k % 3 == 0) x.repetition = 1.7f;  // negative or positive, whichever the row has there
    if (k % 3 == 1) x.add = -(0.5f * static_cast<float>(k % 4) + 0.25f);
    if (k % 3 == 2) x.bias = (k % 2 ? 1.5f : -2.0f);
    a.push_back(x);
  }
  std::shuffle(a.begin(), a.end(), rng);
  return a;
}

void set_row_adjustments(Entry& e, const std::vector<float>& logits, int64_t first_row, int64_t vocab,
                         std::mt19937_64& rng) {
  e.offsets.assign(1, 0);
  for (int64_t r = 0; r <= static_cast<int64_t>(e.drafts.size()); ++r) {
    auto row = row_adjustments(logits.data() + (first_row + r) * vocab, vocab, rng);
    e.adjustments.insert(e.adjustments.end(), row.begin(), row.end());
    e.offsets.push_back(static_cast<int32_t>(e.adjustments.size()));
  }
}

class DeviceSelection : public ::testing::TestWithParam<int64_t> {};

// Greedy rows with adjustments: the lifted low token wins on the device as on the host; with logprobs (the model's
// own, not the adjusted row's) of every width the server allows.
TEST_P(DeviceSelection, GreedyWithAdjustmentsAndLogprobs) {
  const int64_t vocab = GetParam();
  std::mt19937_64 rng(11 + vocab);
  std::vector<Entry> entries(5);
  const std::vector<float> logits = random_rows(5, vocab, rng);
  const int32_t top_n[] = {-1, 0, 1, 5, 20};
  for (int i = 0; i < 5; ++i) {
    entries[i].sel.select = true;
    entries[i].sel.logprobs = top_n[i];
    set_row_adjustments(entries[i], logits, i, vocab, rng);
  }
  entries[3].adjustments.erase(entries[3].adjustments.begin(), entries[3].adjustments.end());  // logprobs alone
  entries[3].offsets.clear();
  const Outcome o = run_both(logits, vocab, entries);
  expect_same(o, entries);
  ASSERT_EQ(o.device.tokens[0].size(), 1u);
  EXPECT_EQ(o.device.tokens[0][0], argmin(logits.data(), vocab)) << "the biased lowest token should win";
  EXPECT_EQ(o.device.tokens[3][0], argmax(logits.data() + 3 * vocab, vocab));
}

// Repetition divides a positive logit and multiplies a negative one; presence / frequency adds follow it.
TEST_P(DeviceSelection, RepetitionOnPositiveAndNegativeLogits) {
  const int64_t vocab = GetParam();
  std::vector<float> logits(2 * vocab, -6.0f);
  logits[7] = 3.0f, logits[9] = 2.9f;            // row 0: 3 / 1.5 = 2 loses to 2.9
  logits[vocab + 4] = -0.5f, logits[vocab + 5] = -0.6f;  // row 1: −0.5 · 3 = −1.5 loses to −0.6 − 0.05
  std::vector<Entry> entries(2);
  for (Entry& e : entries) e.sel.select = true, e.sel.logprobs = 3;
  entries[0].adjustments = {{7, 0.0f, 1.5f, 0.0f}};
  entries[0].offsets = {0, 1};
  entries[1].adjustments = {{4, 0.0f, 3.0f, 0.0f}, {5, 0.0f, 1.0f, -0.05f}};
  entries[1].offsets = {0, 2};
  const Outcome o = run_both(logits, vocab, entries);
  expect_same(o, entries);
  EXPECT_EQ(o.device.tokens[0], std::vector<int32_t>{9});
  EXPECT_EQ(o.device.tokens[1], std::vector<int32_t>{5});
}

// min_p with sampling: the same uniforms give the same tokens; a uniform near 1 would draw from the tail, which
// min_p removes.
TEST_P(DeviceSelection, MinPWithSampling) {
  const int64_t vocab = GetParam();
  std::mt19937_64 rng(23 + vocab);
  const std::vector<float> logits = random_rows(6, vocab, rng);
  std::vector<Entry> entries(6);
  const float min_p[] = {0.05f, 0.2f, 0.5f, 0.1f, 0.02f, 0.3f};
  const double u[] = {0.999, 0.5, 0.01, 0.73, 0.97, 0.31};
  for (int i = 0; i < 6; ++i) {
    TokenSelection& s = entries[i].sel;
    s.select = true;
    s.temperature = i % 2 ? 0.7f : 1.2f;
    s.top_k = i == 3 ? 40 : 0;
    s.top_p = i == 4 ? 0.9f : 1.0f;
    s.min_p = min_p[i];
    s.uniforms = {u[i]};
    s.logprobs = i % 3 == 0 ? 4 : -1;
    if (i >= 4) set_row_adjustments(entries[i], logits, i, vocab, rng);  // adjustments then min_p
  }
  const Outcome o = run_both(logits, vocab, entries);
  expect_same(o, entries);
  for (int i = 0; i < 4; ++i) {  // unadjusted rows: the pick is within min_p of the row's best
    const float* row = logits.data() + i * vocab;
    const int32_t t = o.device.tokens[i][0];
    const double ratio = std::exp((row[t] - row[argmax(row, vocab)]) / static_cast<double>(entries[i].sel.temperature));
    EXPECT_GE(ratio, min_p[i]) << "entry " << i;
  }
}

// Verification: drafts checked against rows that each carry their own adjustments (greedy and sampled), with
// logprobs of the accepted drafts and of the correction / bonus token from the rows that selected them.
TEST_P(DeviceSelection, VerifiedDraftsWithPerRowAdjustments) {
  const int64_t vocab = GetParam();
  std::mt19937_64 rng(37 + vocab);
  constexpr int kDrafts = 4;
  std::vector<Entry> entries(4);
  const std::vector<float> logits = random_rows(4 * (kDrafts + 1), vocab, rng);
  for (int i = 0; i < 4; ++i) {
    Entry& e = entries[i];
    e.sel.select = true;
    e.sel.logprobs = i == 3 ? -1 : 5;
    e.drafts.assign(kDrafts, 0);
    set_row_adjustments(e, logits, i * (kDrafts + 1), vocab, rng);
    // Drafts the adjusted rows accept for a while: the host's own adjusted argmax of each row, one wrong at
    // position `i` for entries 0..2 (entry 3 accepts all and takes the bonus).
    for (int k = 0; k < kDrafts; ++k) {
      std::vector<float> row(logits.begin() + (i * (kDrafts + 1) + k) * vocab,
                             logits.begin() + (i * (kDrafts + 1) + k + 1) * vocab);
      apply_logit_adjustments(row.data(), std::span<const LogitAdjustment>(e.adjustments).subspan(
                                              e.offsets[k], e.offsets[k + 1] - e.offsets[k]));
      const int32_t best = argmax(row.data(), vocab);
      e.drafts[k] = k == i && i < 3 ? (best + 1) % static_cast<int32_t>(vocab) : best;
    }
    if (i == 2) {  // sampled verification of the same drafts (one-hot q)
      e.sel.temperature = 0.9f;
      e.sel.top_p = 0.95f;
      for (int k = 0; k <= kDrafts; ++k) e.sel.uniforms.push_back(0.05 + 0.17 * k);
    }
  }
  const Outcome o = run_both(logits, vocab, entries);
  expect_same(o, entries);
  EXPECT_EQ(o.device.accepted[0], 0);
  EXPECT_EQ(o.device.accepted[1], 1);
  EXPECT_EQ(o.device.accepted[3], kDrafts);
}

// Masks and adjustments together: a bias lifts a token the grammar forbids, which must still lose; logprobs stay
// the model's own even for the rows the masks rewrote in place.
TEST_P(DeviceSelection, MasksAndAdjustmentsTogether) {
  const int64_t vocab = GetParam();
  std::mt19937_64 rng(41 + vocab);
  const int64_t words = token_mask_words(vocab);
  std::vector<Entry> entries(3);
  const std::vector<float> logits = random_rows(3 + 2, vocab, rng, /*quarter_steps=*/true);
  std::bernoulli_distribution allowed(0.4);
  int64_t row = 0;
  for (int i = 0; i < 3; ++i) {
    Entry& e = entries[i];
    e.sel.select = true;
    e.sel.logprobs = 20;
    if (i == 1) {
      e.drafts = {static_cast<int32_t>(vocab / 3), static_cast<int32_t>(vocab / 5)};
      e.sel.temperature = 1.0f;
      e.sel.min_p = 0.05f;
      e.sel.uniforms = {0.3, 0.6, 0.45};
    }
    const int64_t rows = static_cast<int64_t>(e.drafts.size()) + 1;
    set_row_adjustments(e, logits, row, vocab, rng);
    e.allowed.assign(rows * words, 0u);
    for (int64_t r = 0; r < rows; ++r) {
      uint32_t* bits = e.allowed.data() + r * words;
      for (int64_t v = 0; v < vocab; ++v)
        if (allowed(rng)) bits[v / 32] |= 1u << (v % 32);
      const int32_t lifted = argmin(logits.data() + (row + r) * vocab, vocab);  // row_adjustments lifts it
      bits[lifted / 32] &= ~(1u << (lifted % 32));
    }
    row += rows;
  }
  const Outcome o = run_both(logits, vocab, entries);
  expect_same(o, entries);
  for (size_t i = 0; i < entries.size(); ++i)
    for (size_t t = 0; t < o.device.tokens[i].size(); ++t) {
      const int32_t token = o.device.tokens[i][t];
      EXPECT_TRUE(token_allowed(entries[i].allowed.data() + t * words, token)) << "entry " << i << " token " << t;
    }
}

// Repeated tokens in one row would be applied at once on the device: refused, not raced.
TEST(DeviceSelectionArgs, RefusesARowThatAdjustsATokenTwice) {
  const int64_t vocab = 64;
  std::vector<float> logits(vocab, 0.0f);
  std::vector<Entry> entries(1);
  entries[0].sel.select = true;
  entries[0].adjustments = {{3, 1.0f, 1.0f, 0.0f}, {3, 1.0f, 1.0f, 0.0f}};
  entries[0].offsets = {0, 2};
  entries[0].bind();
  DeviceBuffer<float> d_logits(logits);
  cuda::DeviceTokenSelection selection;
  StepOutput out;
  const std::vector<int64_t> first_row = {0};
  const std::vector<TokenSelection> select = {entries[0].sel};
  EXPECT_FALSE(selection.select(d_logits.get(), vocab, first_row, select, nullptr, out).ok());
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, DeviceSelection, ::testing::Values(151552, 1000, 37));

}  // namespace
}  // namespace kiln::test
