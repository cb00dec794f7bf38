#include "kernels/cpu/token_select.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "kernels/cpu/topk.h"
#include "kernels/random_data.h"

namespace kiln::cpu {
namespace {

// One select_tokens call's inputs and outputs, laid out as the engine would: rows, drafts, q rows and uniforms of all
// sequences back to back, unless a test places them otherwise.
struct Batch {
  int64_t vocab = 0;
  int64_t max_drafts = 0;
  std::vector<float> logits;
  std::vector<SelectSeq> seqs;
  std::vector<int32_t> drafts;
  int64_t q_width = 0;  // 0: greedy drafts (no q)
  std::vector<int32_t> q_ids;
  std::vector<float> q_probs;
  std::vector<double> uniforms;
  std::vector<int32_t> tokens, accepted;

  // Appends a sequence: its K + 1 rows, its K drafts with their q rows (q_width entries each), its K + 1 uniforms.
  void add(const std::vector<float>& rows, SelectParams params, const std::vector<int32_t>& seq_drafts,
           const std::vector<int32_t>& seq_q_ids = {}, const std::vector<float>& seq_q_probs = {},
           const std::vector<double>& seq_uniforms = {}) {
    const int32_t k = static_cast<int32_t>(seq_drafts.size());
    EXPECT_EQ(static_cast<int64_t>(rows.size()), (k + 1) * vocab);
    seqs.push_back({static_cast<int32_t>(logits.size() / vocab), k, static_cast<int32_t>(drafts.size()),
                    static_cast<int32_t>(uniforms.size()), params});
    logits.insert(logits.end(), rows.begin(), rows.end());
    drafts.insert(drafts.end(), seq_drafts.begin(), seq_drafts.end());
    q_ids.insert(q_ids.end(), seq_q_ids.begin(), seq_q_ids.end());
    q_probs.insert(q_probs.end(), seq_q_probs.begin(), seq_q_probs.end());
    std::vector<double> u = seq_uniforms;
    u.resize(k + 1, 0.5);
    uniforms.insert(uniforms.end(), u.begin(), u.end());
    max_drafts = std::max<int64_t>(max_drafts, k);
  }

  SelectArgs args() {
    const int64_t n = static_cast<int64_t>(seqs.size());
    tokens.assign(n * (max_drafts + 1), -7);
    accepted.assign(n, -7);
    return {logits.data(),
            vocab,
            seqs.data(),
            n,
            drafts.data(),
            q_width > 0 ? q_ids.data() : nullptr,
            q_width > 0 ? q_probs.data() : nullptr,
            q_width,
            uniforms.data(),
            tokens.data(),
            accepted.data(),
            max_drafts};
  }

  Status run() { return select_tokens(args()); }

  std::vector<int32_t> tokens_of(size_t s) const {
    return {tokens.begin() + s * (max_drafts + 1), tokens.begin() + (s + 1) * (max_drafts + 1)};
  }
};

std::vector<float> distribution(const float* logits, int64_t vocab, SelectParams p) {
  std::vector<float> probs(vocab);
  sampling_distribution(logits, vocab, {p.temperature, p.top_k, p.top_p}, probs.data());
  return probs;
}

TEST(TokenSelect, DrawWithGivenUniformMatchesRngDraw) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto probs = test::random_floats(300, 100 + seed, 0.0f, 1.0f);
    for (size_t i = 0; i < probs.size(); i += 3) probs[i] = 0.0f;
    std::mt19937_64 a(seed), b(seed);
    for (int d = 0; d < 20; ++d)
      ASSERT_EQ(sample_from_distribution(probs.data(), 300, a),
                sample_from_distribution_u(probs.data(), 300, uniform_53(b)));
  }
  const float zeros_then_one[] = {0.0f, 0.0f, 0.25f, 0.0f};
  EXPECT_EQ(sample_from_distribution_u(zeros_then_one, 4, 0.0), 2);
  EXPECT_EQ(sample_from_distribution_u(zeros_then_one, 4, 0.999999), 2);
}

TEST(TokenSelect, PlainSamplingIsCpuSample) {
  const int64_t vocab = 2000;
  const std::vector<SelectParams> settings = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f},   {0.7f, 40, 1.0f},
                                              {1.2f, 0, 0.8f}, {0.9f, 100, 0.5f}, {0.5f, 1, 1.0f}};
  Batch b{vocab};
  std::vector<int32_t> want;
  std::mt19937_64 rng(9);
  for (size_t s = 0; s < settings.size() * 4; ++s) {
    const SelectParams p = settings[s % settings.size()];
    const auto row = test::random_floats(vocab, 200 + s, -4.0f, 4.0f);
    std::mt19937_64 draw = rng, copy = rng;
    rng.discard(3);
    want.push_back(sample(row.data(), vocab, {p.temperature, p.top_k, p.top_p}, draw));
    b.add(row, p, {}, {}, {}, {uniform_53(copy)});
  }
  b.max_drafts = 2;  // wider than any sequence needs: the rest of each token row is −1
  ASSERT_TRUE(b.run().ok());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(b.tokens_of(s), (std::vector<int32_t>{want[s], -1, -1})) << s;
    EXPECT_EQ(b.accepted[s], 0);
  }
}

// Greedy verification written out: drafts accepted while each equals its row's argmax, then the argmax of the
// first mismatching row (or of row K as the bonus).
struct Verification {
  std::vector<int32_t> tokens;
  int64_t accepted = 0;
};
Verification verify_greedy(const float* rows, int64_t vocab, const std::vector<int32_t>& drafts) {
  Verification v;
  const int64_t K = static_cast<int64_t>(drafts.size());
  for (int64_t i = 0; i <= K; ++i) {
    const int32_t target = argmax(rows + i * vocab, vocab);
    v.tokens.push_back(target);
    if (i == K || drafts[i] != target) break;
    ++v.accepted;
  }
  return v;
}

TEST(TokenSelect, GreedyVerificationIsVerifyGreedy) {
  const int64_t vocab = 500;
  Batch b{vocab};
  std::vector<Verification> want;
  std::mt19937_64 rng(11);
  for (int s = 0; s < 40; ++s) {
    const int k = s % 6;
    auto rows = test::random_floats((k + 1) * vocab, 300 + s, -3.0f, 3.0f);
    if (s % 3 == 0) rows[7] = rows[argmax(rows.data(), vocab)];  // an equal maximum at a higher index in row 0
    std::vector<int32_t> drafts(k);
    const int mismatch = static_cast<int>(rng() % (k + 1));  // k: all drafts match
    for (int i = 0; i < k; ++i) {
      drafts[i] = argmax(rows.data() + i * vocab, vocab);
      if (i == mismatch) drafts[i] = (drafts[i] + 1 + static_cast<int32_t>(rng() % (vocab - 1))) % vocab;
    }
    want.push_back(verify_greedy(rows.data(), vocab, drafts));
    b.add(rows, {s % 2 ? 0.0f : 0.8f, s % 2 ? 0 : 1, 1.0f}, drafts);
  }
  b.uniforms.clear();  // greedy sequences read none
  ASSERT_TRUE(b.run().ok());
  for (size_t s = 0; s < want.size(); ++s) {
    auto got = b.tokens_of(s);
    ASSERT_EQ(b.accepted[s], want[s].accepted) << s;
    got.resize(want[s].tokens.size());
    EXPECT_EQ(got, want[s].tokens) << s;
  }
}

TEST(TokenSelect, SampledDecisionsFollowTheRule) {
  const int64_t vocab = 64;
  const SelectParams params{0.8f, 20, 0.9f};
  const auto rows = test::random_floats(3 * vocab, 400, -3.0f, 3.0f);
  const auto p0 = distribution(rows.data(), vocab, params);
  const auto p2 = distribution(rows.data() + 2 * vocab, vocab, params);
  const int32_t likely = argmax(rows.data(), vocab);
  int32_t outside = 0;  // a token the target's top-k leaves out: p0 = 0
  while (p0[outside] > 0.0f) ++outside;
  const int32_t second = argmax(rows.data() + vocab, vocab);
  // Ids for q rows, distinct from the drafts and from each other.
  std::vector<int32_t> other;
  for (int32_t id = 0; other.size() < 3; ++id)
    if (id != likely && id != outside && id != second) other.push_back(id);

  // Greedy drafts (q one-hot): x is accepted iff u < p(x).
  for (double u : {0.0, 0.3, 0.999}) {
    Batch b{vocab};
    b.add(rows, params, {likely, second}, {}, {}, {u, 0.0, 0.42});
    ASSERT_TRUE(b.run().ok());
    if (u < p0[likely]) {
      EXPECT_EQ(b.accepted[0], 2);
      EXPECT_EQ(b.tokens_of(0),
                (std::vector<int32_t>{likely, second, sample_from_distribution_u(p2.data(), vocab, 0.42)}));
    } else {
      EXPECT_EQ(b.accepted[0], 0);
      std::vector<float> residual = p0;
      residual[likely] = std::max(p0[likely] - 1.0f, 0.0f);
      EXPECT_EQ(b.tokens_of(0)[0], sample_from_distribution_u(residual.data(), vocab, 0.42));
      EXPECT_NE(b.tokens_of(0)[0], likely);
    }
  }
  // A draft outside the target's support is always rejected, and the correction never repeats it.
  for (double u : {0.0, 0.5}) {
    Batch b{vocab};
    b.add(rows, params, {outside, second}, {}, {}, {u, 0.0, 0.7});
    ASSERT_TRUE(b.run().ok());
    EXPECT_EQ(b.accepted[0], 0);
    EXPECT_EQ(b.tokens_of(0), (std::vector<int32_t>{sample_from_distribution_u(p0.data(), vocab, 0.7), -1, -1}));
  }
  // Sparse q: q(x) ≤ p(x) accepts whatever u; q(x) = 0 (not listed) accepts iff p(x) > 0.
  {
    Batch b{vocab};
    b.q_width = 4;
    b.add(rows, params, {likely, second}, {likely, other[0], -1, other[1], other[2], second, -1, -1},
          {p0[likely] * 0.5f, 0.2f, 0.0f, 0.1f, 0.3f, 0.0f, 0.0f, 0.0f}, {0.999999, 0.999999, 0.1});
    ASSERT_TRUE(b.run().ok());
    EXPECT_EQ(b.accepted[0], 2);
    EXPECT_EQ(b.tokens_of(0)[2], sample_from_distribution_u(p2.data(), vocab, 0.1));
  }
  // A rejected sparse draft: the correction comes from norm(max(p − q, 0)).
  {
    Batch b{vocab};
    b.q_width = 3;
    const float q_likely = std::min(1.0f, p0[likely] * 1.5f);
    b.add(rows, params, {likely, second}, {other[0], likely, outside, second, -1, -1}, {0.05f, q_likely, 0.4f, 1, 0, 0},
          {0.9999, 0.0, 0.3});
    ASSERT_LT(p0[likely], 0.9999 * q_likely);
    ASSERT_TRUE(b.run().ok());
    std::vector<float> residual = p0;
    residual[other[0]] = std::max(p0[other[0]] - 0.05f, 0.0f);
    residual[likely] = std::max(p0[likely] - q_likely, 0.0f);
    EXPECT_EQ(b.accepted[0], 0);
    EXPECT_EQ(b.tokens_of(0)[0], sample_from_distribution_u(residual.data(), vocab, 0.3));
  }
}

TEST(TokenSelect, NoResidualMassFallsBackToTheTarget) {
  // q covers the target's support with exactly p and also lists the draft, which p never proposes: the draft is
  // rejected and max(p − q, 0) is zero everywhere.
  const int64_t vocab = 6;
  const SelectParams params{1.0f, 3, 1.0f};
  const std::vector<float> rows = {0.5f, 2.0f, -1.0f, 1.0f, 1.5f, 0.0f, 0, 0, 0, 0, 0, 0};
  const auto p = distribution(rows.data(), vocab, params);
  Batch b{vocab};
  b.q_width = 4;
  b.add(rows, params, {0}, {1, 3, 4, 0}, {p[1], p[3], p[4], 0.5f}, {0.1, 0.55});
  ASSERT_TRUE(b.run().ok());
  EXPECT_EQ(b.accepted[0], 0);
  EXPECT_EQ(b.tokens_of(0)[0], sample_from_distribution_u(p.data(), vocab, 0.55));
}

TEST(TokenSelect, SequencesAreIndependentOfTheirPlacement) {
  const int64_t vocab = 300;
  std::mt19937_64 rng(13);
  Batch all{vocab};
  all.q_width = 8;
  std::vector<Batch> alone;
  for (int s = 0; s < 12; ++s) {
    const int k = s % 4;
    const auto rows = test::random_floats((k + 1) * vocab, 500 + s, -2.0f, 2.0f);
    std::vector<int32_t> drafts(k), ids(k * 8, -1);
    std::vector<float> probs(k * 8, 0.0f);
    for (int i = 0; i < k; ++i) {
      drafts[i] = argmax(rows.data() + i * vocab, vocab);
      for (int c = 0; c < 5; ++c) {
        ids[i * 8 + c] = (drafts[i] + 7 * c) % vocab;
        probs[i * 8 + c] = c == 0 ? 0.6f : 0.1f;
      }
    }
    std::vector<double> u(k + 1);
    for (auto& x : u) x = uniform_53(rng);
    const SelectParams params{s % 3 ? 0.9f : 0.0f, s % 2 ? 30 : 0, s % 4 ? 0.95f : 1.0f};
    all.add(rows, params, drafts, ids, probs, u);
    alone.push_back(Batch{vocab});
    alone.back().q_width = 8;
    alone.back().add(rows, params, drafts, ids, probs, u);
  }
  // Reverse the order of the sequences' rows, drafts (with their q rows) and uniforms in memory, each sequence's own
  // block keeping its order: only the offsets say where a sequence is.
  Batch moved = all;
  const int64_t rows_total = static_cast<int64_t>(all.logits.size()) / vocab;
  const int64_t drafts_total = static_cast<int64_t>(all.drafts.size());
  const int64_t uniforms_total = static_cast<int64_t>(all.uniforms.size());
  for (size_t s = 0; s < all.seqs.size(); ++s) {
    const SelectSeq& from = all.seqs[s];
    SelectSeq& to = moved.seqs[s];
    const int64_t k = from.num_drafts;
    to.first_row = static_cast<int32_t>(rows_total - from.first_row - (k + 1));
    to.draft_offset = static_cast<int32_t>(drafts_total - from.draft_offset - k);
    to.u_offset = static_cast<int32_t>(uniforms_total - from.u_offset - (k + 1));
    std::copy_n(all.logits.begin() + from.first_row * vocab, (k + 1) * vocab,
                moved.logits.begin() + to.first_row * vocab);
    std::copy_n(all.drafts.begin() + from.draft_offset, k, moved.drafts.begin() + to.draft_offset);
    std::copy_n(all.q_ids.begin() + from.draft_offset * 8, k * 8, moved.q_ids.begin() + to.draft_offset * 8);
    std::copy_n(all.q_probs.begin() + from.draft_offset * 8, k * 8, moved.q_probs.begin() + to.draft_offset * 8);
    std::copy_n(all.uniforms.begin() + from.u_offset, k + 1, moved.uniforms.begin() + to.u_offset);
  }
  ASSERT_TRUE(all.run().ok());
  ASSERT_TRUE(moved.run().ok());
  EXPECT_EQ(moved.tokens, all.tokens);
  EXPECT_EQ(moved.accepted, all.accepted);
  for (size_t s = 0; s < alone.size(); ++s) {
    ASSERT_TRUE(alone[s].run().ok());
    auto got = all.tokens_of(s);
    got.resize(alone[s].max_drafts + 1);
    EXPECT_EQ(got, alone[s].tokens) << s;
    EXPECT_EQ(all.accepted[s], alone[s].accepted[0]) << s;
  }
}

// Rejection sampling is lossless: with drafts drawn from q, each emitted token is distributed as the target's own
// sampling distribution for its position, whatever q is, and draft i is accepted with probability Σ min(p_i, q_i).
// Here the target's rows do not depend on the drafts, so position j's token, among trials that reach it, ~ p_j.
void expect_lossless(const std::vector<float>& target, const std::vector<float>& draft_logits, int64_t vocab, int k,
                     SelectParams params, int64_t q_width, float draft_temperature, uint64_t seed) {
  // Draft distributions from cpu::sample_drafts (q_width = 0: greedy drafts at each draft row's argmax).
  std::vector<int32_t> q_ids(k * std::max<int64_t>(q_width, 1)), greedy_drafts(k);
  std::vector<float> q_probs(q_ids.size());
  std::vector<float> temps(k, q_width > 0 ? draft_temperature : 0.0f);
  std::vector<double> zero_u(k, 0.0);
  ASSERT_TRUE(sample_drafts({draft_logits.data(), k, vocab, temps.data(), zero_u.data(), std::max<int64_t>(q_width, 1),
                             greedy_drafts.data(), q_ids.data(), q_probs.data()})
                  .ok());
  std::vector<std::vector<float>> p(k + 1), q(k);
  for (int i = 0; i <= k; ++i) p[i] = distribution(target.data() + i * vocab, vocab, params);
  for (int i = 0; i < k; ++i) {
    q[i].assign(vocab, 0.0f);
    if (q_width == 0) q[i][greedy_drafts[i]] = 1.0f;
    for (int64_t c = 0; q_width > 0 && c < q_width; ++c)
      if (q_ids[i * q_width + c] >= 0) q[i][q_ids[i * q_width + c]] = q_probs[i * q_width + c];
  }

  std::mt19937_64 rng(seed);
  const int trials = 120000;
  std::vector<std::vector<int>> counts(k + 1, std::vector<int>(vocab, 0));
  std::vector<int> reached(k + 1, 0);
  int first_accepted = 0;
  std::vector<SelectSeq> seq = {{0, k, 0, 0, params}};
  std::vector<int32_t> drafts(k), tokens(k + 1), accepted(1);
  std::vector<double> u(k + 1);
  for (int t = 0; t < trials; ++t) {
    for (int i = 0; i < k; ++i) drafts[i] = sample_from_distribution_u(q[i].data(), vocab, uniform_53(rng));
    for (auto& x : u) x = uniform_53(rng);
    ASSERT_TRUE(
        select_tokens({target.data(), vocab, seq.data(), 1, drafts.data(), q_width > 0 ? q_ids.data() : nullptr,
                       q_width > 0 ? q_probs.data() : nullptr, q_width, u.data(), tokens.data(), accepted.data(), k})
            .ok());
    first_accepted += accepted[0] > 0;
    for (int j = 0; j <= accepted[0]; ++j) {
      ++reached[j];
      ++counts[j][tokens[j]];
    }
  }
  for (int j = 0; j <= k; ++j) {
    ASSERT_GT(reached[j], 1000) << "position " << j << " is reached too rarely to test";
    for (int64_t x = 0; x < vocab; ++x) {
      const double pj = p[j][x], n = reached[j];
      const double sigma = std::sqrt(std::max(pj * (1 - pj), 1e-12) / n);
      EXPECT_NEAR(counts[j][x] / n, pj, 5 * sigma + 1e-9) << "position " << j << ", token " << x;
    }
  }
  double overlap = 0.0;
  for (int64_t x = 0; x < vocab; ++x) overlap += std::min(p[0][x], q[0][x]);
  EXPECT_NEAR(static_cast<double>(first_accepted) / trials, overlap, 5 * std::sqrt(overlap * (1 - overlap) / trials));
}

TEST(TokenSelect, RejectionSamplingIsLossless) {
  const int64_t vocab = 10;
  const int k = 3;
  const auto target = test::random_floats((k + 1) * vocab, 600, -1.5f, 1.5f);
  auto draft = target;
  const auto noise = test::random_floats(draft.size(), 601, -1.0f, 1.0f);
  for (size_t i = 0; i < draft.size(); ++i) draft[i] += noise[i];
  // Sparse q narrower than the target's support (tokens with q = 0 only come from corrections), and wider.
  expect_lossless(target, draft, vocab, k, {1.0f, 0, 1.0f}, 4, 1.0f, 1);
  expect_lossless(target, draft, vocab, k, {0.7f, 6, 0.9f}, 8, 1.3f, 2);
  // Greedy drafts: q one-hot at each draft row's argmax (the target's own, so that every position is reached often).
  expect_lossless(target, target, vocab, k, {0.5f, 0, 0.95f}, 0, 0.0f, 3);
}

TEST(TokenSelect, SmallestVocabulary) {
  Batch b{1};
  b.add({0.3f, -2.0f, 5.0f}, {1.0f, 0, 0.5f}, {0, 0}, {}, {}, {0.99, 0.5, 0.2});
  b.add({1.0f}, {0.0f, 0, 1.0f}, {});
  ASSERT_TRUE(b.run().ok());
  EXPECT_EQ(b.accepted, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{0, 0, 0, 0, -1, -1}));
}

TEST(TokenSelect, RejectsBadArguments) {
  const int64_t vocab = 16;
  auto make = [&] {
    Batch b{vocab};
    b.q_width = 2;
    b.add(test::random_floats(3 * vocab, 700), {1.0f, 0, 1.0f}, {1, 2}, {1, 4, 2, -1}, {0.5f, 0.5f, 1.0f, 0.0f},
          {0.1, 0.2, 0.3});
    return b;
  };
  ASSERT_TRUE(make().run().ok());
  auto expect_invalid = [](Batch b, auto&& edit) {
    SelectArgs a = b.args();
    edit(a, b);
    const Status s = select_tokens(a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  };
  expect_invalid(make(), [](SelectArgs& a, Batch&) { a.vocab = 0; });
  expect_invalid(make(), [](SelectArgs& a, Batch&) { a.max_drafts = 1; });  // a sequence has 2 drafts
  expect_invalid(make(), [](SelectArgs& a, Batch& b) { b.drafts[1] = 16; });
  expect_invalid(make(), [](SelectArgs& a, Batch& b) { b.q_ids[1] = 1; });   // listed twice
  expect_invalid(make(), [](SelectArgs& a, Batch& b) { b.q_ids[3] = 99; });  // out of range
  expect_invalid(make(), [](SelectArgs& a, Batch& b) { b.q_probs[0] = -0.1f; });
  expect_invalid(make(), [](SelectArgs& a, Batch&) { a.q_width = 0; });
  expect_invalid(make(), [](SelectArgs& a, Batch&) { a.q_width = 257; });
  expect_invalid(make(), [](SelectArgs& a, Batch& b) { b.uniforms[2] = 1.0; });
  expect_invalid(make(), [](SelectArgs& a, Batch&) { a.uniforms = nullptr; });
  expect_invalid(make(), [](SelectArgs& a, Batch&) { a.tokens = nullptr; });
  expect_invalid(make(), [](SelectArgs& a, Batch& b) { b.seqs[0].first_row = -1; });

  DraftSampleArgs d{nullptr, 1, vocab, nullptr, nullptr, 4, nullptr, nullptr, nullptr};
  EXPECT_EQ(sample_drafts(d).code(), StatusCode::kInvalidArgument);
  d.rows = 0;
  EXPECT_TRUE(sample_drafts(d).ok());
  d.q_width = 0;
  EXPECT_EQ(sample_drafts(d).code(), StatusCode::kInvalidArgument);
}

TEST(TokenSelect, DraftSamplingIsTopCSampling) {
  const int64_t vocab = 1000;
  for (int64_t width : {1, 7, 64, 256}) {
    const int64_t rows = 6;
    auto logits = test::random_floats(rows * vocab, 800 + width, -3.0f, 3.0f);
    for (int64_t i = 0; i < vocab; ++i) logits[2 * vocab + i] = std::round(logits[2 * vocab + i] * 2) / 2;  // ties
    std::vector<float> temps = {1.0f, 0.0f, 0.8f, 1.5f, -1.0f, 0.3f};
    std::vector<double> u(rows);
    // One draw per row that cpu::sample draws for (temperature > 0, and not top-1), so `replay` stays in step.
    std::mt19937_64 rng(width), replay(width);
    for (int64_t r = 0; r < rows; ++r) u[r] = temps[r] > 0.0f && width > 1 ? uniform_53(rng) : 0.5;
    std::vector<int32_t> tokens(rows), ids(rows * width);
    std::vector<float> probs(rows * width);
    ASSERT_TRUE(sample_drafts({logits.data(), rows, vocab, temps.data(), u.data(), width, tokens.data(), ids.data(),
                               probs.data()})
                    .ok());
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * vocab;
      const int32_t* row_ids = ids.data() + r * width;
      const float* row_probs = probs.data() + r * width;
      const SamplingParams params{temps[r], width, 1.0f};
      EXPECT_EQ(tokens[r], sample(row, vocab, params, replay)) << "width " << width << " row " << r;
      if (temps[r] <= 0.0f) {
        EXPECT_TRUE(std::all_of(row_ids, row_ids + width, [](int32_t id) { return id == -1; }));
        EXPECT_TRUE(std::all_of(row_probs, row_probs + width, [](float p) { return p == 0.0f; }));
        continue;
      }
      std::vector<int32_t> top(width);
      topk_indices(row, vocab, width, top.data());
      std::sort(top.begin(), top.end());
      EXPECT_EQ(std::vector<int32_t>(row_ids, row_ids + width), top);
      std::vector<float> want(vocab);
      sampling_distribution(row, vocab, params, want.data());
      double total = 0.0;
      for (int64_t c = 0; c < width; ++c) {
        EXPECT_EQ(row_probs[c], want[row_ids[c]]);
        total += row_probs[c];
      }
      EXPECT_NEAR(total, 1.0, 1e-5);
      EXPECT_TRUE(std::find(row_ids, row_ids + width, tokens[r]) != row_ids + width);
    }
  }
  // A vocabulary narrower than q: every id, then empty slots.
  const auto logits = test::random_floats(5, 900);
  const float temp = 1.0f;
  const double u = 0.3;
  int32_t token = -1;
  std::vector<int32_t> ids(8);
  std::vector<float> probs(8);
  ASSERT_TRUE(sample_drafts({logits.data(), 1, 5, &temp, &u, 8, &token, ids.data(), probs.data()}).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3, 4, -1, -1, -1}));
  EXPECT_EQ(probs[5], 0.0f);
  EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-6);
}

}  // namespace
}  // namespace kiln::cpu
