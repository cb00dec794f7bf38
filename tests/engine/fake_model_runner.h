// A stand-in model for engine tests. Its "KV cache" is the token ids themselves: each step writes its tokens
// into the slots its block table names and reads the sequence's whole history back through the same table.
// The logits are a hash of that history, so a sequence's tokens depend on nothing but its own past — any
// paging mistake (a block shared while written, freed while in use, a position never computed) changes the
// tokens or is reported as a contract violation.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "model/host_token_select.h"

namespace kiln::testing {

inline uint64_t mix64(uint64_t h, uint64_t v) {
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The fake model's summary of a history: a running hash, token by token (what its "recurrent state" holds).
inline constexpr uint64_t kFakeHashStart = 1469598103934665603ull;
inline uint64_t fake_hash(uint64_t h, int32_t token) { return mix64(h, static_cast<uint32_t>(token)); }

// Logits of the next token after the history hashed to `h`.
inline void fake_logits_from_hash(uint64_t h, int64_t vocab, float* out) {
  for (int64_t v = 0; v < vocab; ++v)
    out[v] = static_cast<float>(mix64(h, v) >> 40) / static_cast<float>(1 << 24) * 8.0f;
}

// The fake model: logits of the next token after `history`.
inline void fake_logits(std::span<const int32_t> history, int64_t vocab, float* out) {
  uint64_t h = kFakeHashStart;
  for (int32_t t : history) h = fake_hash(h, t);
  fake_logits_from_hash(h, vocab, out);
}

// What one request yields run alone: the reference every batched run must reproduce.
inline std::vector<int32_t> reference_tokens(std::vector<int32_t> history, int64_t max_tokens,
                                             const std::vector<int32_t>& stop, int64_t vocab,
                                             const SamplingOptions& sampling = {}) {
  Sampler sampler(sampling);
  std::vector<float> logits(vocab);
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < max_tokens) {
    fake_logits(history, vocab, logits.data());
    const int32_t t = sampler.next(logits.data(), vocab);
    out.push_back(t);
    history.push_back(t);
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
  }
  return out;
}

struct RecordedStep {
  const void* table = nullptr;  // identifies the sequence within one call
  int64_t start = 0, tokens = 0;
  bool all_logits = false;      // a verification pass's entry (t_L and its drafts)
};

class FakeModelRunner final : public ModelRunner {
 public:
  FakeModelRunner(int64_t num_blocks, int64_t block_size, int64_t vocab)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        vocab_(vocab),
        slot_token_(num_blocks * block_size, -1),
        slot_pos_(num_blocks * block_size, -1) {}

  int64_t vocab_size() const override { return vocab_; }
  // The bound the engine is told (the fake model itself is invariant at any size); records() shows what it ran.
  void set_batch_invariance(BatchInvariance bound) { bound_ = bound; }
  BatchInvariance batch_invariance() const override { return bound_; }
  bool applies_token_masks() const override { return true; }  // select_tokens_host applies them
  bool applies_logit_adjustments() const override { return true; }

  // Makes the model recurrent: its logits come from a per-sequence state (the running hash) kept in state slot
  // memory — entry 0 of layer 0 of `views`, 8 bytes per slot, as a CacheManager with that spec holds it — advanced
  // by every token a step feeds, as a linear-attention layer's state is. A step whose stored state is not the hash
  // of the sequence's computed history (state advanced past rejected drafts and never rolled back) is a violation.
  void keep_state(const CacheViews* views) { state_views_ = views; }

  Status step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select, const StepOptions& options,
              StepOutput& out) override {
    if (close_at_.load() == calls_.load() + 1) close_gate();
    wait_gate();
    const int64_t call = calls_.fetch_add(1) + 1;
    if (call == fail_on_call_) return internal_error("injected failure on call " + std::to_string(call));
    std::vector<RecordedStep> record;
    std::map<int32_t, size_t> writer;  // block → the step writing into it
    std::set<const void*> tables;
    for (size_t s = 0; s < steps.size(); ++s) {
      const SequenceStep& st = steps[s];
      const int64_t n = static_cast<int64_t>(st.tokens.size());
      if (n == 0 || !st.block_table) return violation("a step without tokens or block table");
      if (!tables.insert(st.block_table).second) return violation("one sequence twice in a batch");
      const auto& table = *st.block_table;
      const int64_t end = st.start_position + n;
      if (static_cast<int64_t>(table.size()) * block_size_ < end)
        return violation("block table covers " + std::to_string(table.size() * block_size_) +
                         " positions, step ends at " + std::to_string(end));
      if (std::set<int32_t>(table.begin(), table.end()).size() != table.size())
        return violation("a block twice in one table");
      for (int32_t b : table)
        if (b < 0 || b >= num_blocks_) return violation("block id " + std::to_string(b) + " outside the pool");
      for (int64_t p = st.start_position; p < end; ++p) writer[table[p / block_size_]] = s;
      record.push_back({st.block_table, st.start_position, n, st.all_logits});
    }
    // A block being written belongs to its writer alone: no other sequence of the batch may hold it.
    for (size_t s = 0; s < steps.size(); ++s) {
      const SequenceStep& st = steps[s];
      const int64_t end = st.start_position + static_cast<int64_t>(st.tokens.size());
      for (int64_t i = 0; i < (end + block_size_ - 1) / block_size_; ++i) {
        auto it = writer.find((*st.block_table)[i]);
        if (it != writer.end() && it->second != s)
          return violation("block " + std::to_string(it->first) + " is written by one sequence and held by another");
      }
    }
    out.first_row.clear();
    std::vector<std::vector<int32_t>> histories;
    for (const auto& st : steps) {
      const auto& table = *st.block_table;
      std::vector<int32_t> history;
      for (int64_t p = 0; p < st.start_position; ++p) {
        const int64_t slot = table[p / block_size_] * block_size_ + p % block_size_;
        if (slot_pos_[slot] != p) return violation("position " + std::to_string(p) + " read before it was computed");
        history.push_back(slot_token_[slot]);
      }
      for (size_t i = 0; i < st.tokens.size(); ++i) {
        const int64_t p = st.start_position + static_cast<int64_t>(i);
        const int64_t slot = table[p / block_size_] * block_size_ + p % block_size_;
        slot_token_[slot] = st.tokens[i];
        slot_pos_[slot] = p;
        history.push_back(st.tokens[i]);
      }
      histories.push_back(std::move(history));
    }
    std::vector<uint64_t> state_start(steps.size(), kFakeHashStart);
    if (state_views_) {
      auto* slots = static_cast<uint64_t*>(state_views_->entry(0, 0));
      for (size_t s = 0; s < steps.size(); ++s) {
        const SequenceStep& st = steps[s];
        if (st.state_slot < 0 || !slots) return violation("a recurrent model's step without a state slot");
        uint64_t expect = kFakeHashStart;
        for (size_t i = 0; i + st.tokens.size() < histories[s].size(); ++i) expect = fake_hash(expect, histories[s][i]);
        uint64_t& state = slots[st.state_slot];
        if (st.start_position == 0) state = kFakeHashStart;  // a new sequence starts from zero state
        if (state != expect)
          return violation("state slot " + std::to_string(st.state_slot) + " does not hold the history before position " +
                           std::to_string(st.start_position));
        state_start[s] = state;
        for (int32_t t : st.tokens) state = fake_hash(state, t);
      }
    }
    size_t rows = 0;
    for (size_t s = 0; s < steps.size(); ++s) rows += steps[s].all_logits ? steps[s].tokens.size() : 1;
    out.logits.resize(rows * vocab_);
    size_t row = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      out.first_row.push_back(static_cast<int64_t>(row));
      const auto& h = histories[s];
      const size_t n = steps[s].tokens.size();
      if (state_views_) {
        // Rows from the state the step started from, advanced token by token.
        uint64_t state = state_start[s];
        for (size_t t = 0; t < n; ++t) {
          state = fake_hash(state, steps[s].tokens[t]);
          if (steps[s].all_logits || t == n - 1) fake_logits_from_hash(state, vocab_, out.logits.data() + row++ * vocab_);
        }
        continue;
      }
      for (size_t t = steps[s].all_logits ? 0 : n - 1; t < n; ++t, ++row)
        fake_logits(std::span<const int32_t>(h.data(), h.size() - n + t + 1), vocab_, out.logits.data() + row * vocab_);
    }
    // Taps: a "hidden state" per token (its token id spread over hidden_size values), as a drafter would get them.
    out.taps.clear();
    taps_.assign(options.tap_layers.size(), {});
    for (size_t t = 0; t < options.tap_layers.size(); ++t) {
      for (const auto& st : steps)
        for (int32_t tok : st.tokens)
          for (int64_t i = 0; i < kTapWidth; ++i) taps_[t].push_back(static_cast<float>(tok) + 0.001f * i);
      out.taps.push_back(TensorView::contiguous(taps_[t].data(), DType::kF32,
                                                {static_cast<int64_t>(taps_[t].size()) / kTapWidth, kTapWidth}));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      records_.push_back(std::move(record));
    }
    if (select.empty()) {
      out.tokens.assign(steps.size(), {});
      out.accepted.assign(steps.size(), 0);
      return ok_status();
    }
    return select_tokens_host(out.logits.data(), vocab_, out.first_row, select, out);
  }

  static constexpr int64_t kTapWidth = 4;

  int64_t calls() const { return calls_.load(); }
  std::vector<std::vector<RecordedStep>> records() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return records_;
  }
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return violations_;
  }
  void fail_on_call(int64_t call) { fail_on_call_ = call; }

  // While closed, step() blocks on entry (tests use it to hold the engine mid-step).
  void close_gate() {
    std::lock_guard<std::mutex> lock(gate_mutex_);
    gate_open_ = false;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(gate_mutex_);
      gate_open_ = true;
    }
    gate_cv_.notify_all();
  }
  // Closes the gate as call `call` (from 1) arrives: the engine holds right before that step, however fast it runs.
  void close_gate_at_call(int64_t call) { close_at_ = call; }
  // Waits until step() is blocked at the gate before call `call`.
  void wait_until_blocked_at(int64_t call) {
    std::unique_lock<std::mutex> lock(gate_mutex_);
    gate_cv_.wait(lock, [&] { return blocked_ && calls_.load() == call - 1; });
  }
  // Waits until step() is blocked at the closed gate.
  void wait_until_blocked() {
    std::unique_lock<std::mutex> lock(gate_mutex_);
    gate_cv_.wait(lock, [&] { return blocked_; });
  }

 private:
  void wait_gate() {
    std::unique_lock<std::mutex> lock(gate_mutex_);
    if (gate_open_) return;
    blocked_ = true;
    gate_cv_.notify_all();
    gate_cv_.wait(lock, [&] { return gate_open_; });
    blocked_ = false;
  }
  Status violation(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    violations_.push_back(what);
    return internal_error("SequenceStep contract: " + what);
  }

  BatchInvariance bound_;
  const CacheViews* state_views_ = nullptr;
  int64_t num_blocks_, block_size_, vocab_;
  std::vector<int32_t> slot_token_;
  std::vector<int64_t> slot_pos_;
  std::atomic<int64_t> calls_{0}, close_at_{0};
  int64_t fail_on_call_ = -1;
  mutable std::mutex mutex_;
  std::vector<std::vector<RecordedStep>> records_;
  std::vector<std::string> violations_;
  std::vector<std::vector<float>> taps_;
  std::mutex gate_mutex_;
  std::condition_variable gate_cv_;
  bool gate_open_ = true, blocked_ = false;
};

}  // namespace kiln::testing
