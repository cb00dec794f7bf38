#include "parallel/rank_processes.h"

#include "parallel/collective_capture.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>

#include "kiln/log.h"
#include "parallel/injected_faults.h"

namespace kiln {
namespace {

enum class CallKind : uint8_t { kStep = 1, kMtpStep, kEmbed, kLmHead, kStop };

// Replies: one byte, 0 (done) or 1 followed by the error.
constexpr char kDone = 0, kFailed = 1;

// How long rank 0 waits for the followers' verdicts once the group broke, or after a call failed without a
// collective that ends calls (they may be stuck in a collective that rank 0 left; then the group is broken anyway).
constexpr std::chrono::milliseconds kFailureGrace{2000};

class Writer {
 public:
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void array(const T* data, size_t n) {
    pod(static_cast<uint64_t>(n));
    if (n) out_.append(reinterpret_cast<const char*>(data), n * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  Status pod(T& v) {
    if (pos_ + sizeof v > in_.size()) return data_loss("rank 0's call is truncated");
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return ok_status();
  }
  template <typename T>
  Status array(std::vector<T>& v) {
    uint64_t n = 0;
    KILN_RETURN_IF_ERROR(pod(n));
    if (n > (in_.size() - pos_) / sizeof(T)) return data_loss("rank 0's call is truncated");
    v.resize(n);
    if (n) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return ok_status();
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

// Copies n elements of T from the model's device (host on the CPU) into `dst`.
template <typename T>
Status to_host(ModelInstance& model, const T* src, size_t n, std::vector<T>& dst) {
  dst.resize(n);
  if (n == 0) return ok_status();
  return model.device_context().copy(dst.data(), src, n * sizeof(T), /*wait=*/true);
}

// ---- what a call carries ----

void write_pool(Writer& w, const CacheViews& c) {
  // Identity of the pool on rank 0: a follower mirrors each pool once.
  w.pod(reinterpret_cast<uint64_t>(pool_identity(c)));
  w.pod(c.num_blocks);
  w.pod(c.block_size);
  w.pod(static_cast<uint64_t>(c.layers.size()));
  for (size_t l = 0; l < c.layers.size(); ++l) {
    std::vector<uint64_t> bytes(c.layers[l].size(), 0);
    for (size_t e = 0; e < bytes.size(); ++e)
      if (l < c.bytes.size() && e < c.bytes[l].size()) bytes[e] = c.bytes[l][e];
    w.array(bytes.data(), bytes.size());
  }
}

Status write_steps(Writer& w, ModelInstance& model, std::span<const SequenceStep> steps) {
  w.pod(static_cast<uint64_t>(steps.size()));
  for (const SequenceStep& s : steps) {
    if (s.device_tokens)
      return internal_error("a step with device tokens (a drafter's chained step) reached the control channel unstaged "
                            "(stage_device_tokens)");
    w.array(s.tokens.data(), s.tokens.size());
    w.pod(s.start_position);
    const bool has_table = s.block_table != nullptr;
    w.pod(has_table);
    if (has_table) w.array(s.block_table->data(), s.block_table->size());
    w.pod(s.all_logits);
    w.pod(s.state_slot);
    w.pod(s.prompt_length);
    w.pod(static_cast<uint64_t>(s.media.size()));
    for (const MediaRows& m : s.media) {
      w.pod(m.first_row);
      w.pod(m.count);
      std::vector<float> rows;
      KILN_RETURN_IF_ERROR(to_host(model, m.embeddings, static_cast<size_t>(m.count * model.hidden_size()), rows));
      w.array(rows.data(), rows.size());
    }
  }
  return ok_status();
}

// Steps whose tokens are all on the host: a drafter's chained next-n step names its tokens on rank 0's device
// (SequenceStep::device_tokens, the draft just sampled there), which no other rank can read. They are staged through
// rank 0's host (one wait for rank 0's stream per chained step), and every rank — rank 0 too, so that all run the
// same step by construction — runs the step on the staged ids: for parallel.tensor > 1 the drafter's device-chained
// path falls back to the per-step path. It costs no more than the call already does: the step's hidden rows cross
// to the host the same way (mtp_step), and a host-staged collective waits for the stream at every meeting anyway.
struct HostTokenSteps {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<SequenceStep> steps;
};

Status stage_device_tokens(ModelInstance& model, std::span<const SequenceStep> steps, HostTokenSteps& out,
                           std::span<const SequenceStep>& use) {
  use = steps;
  if (std::none_of(steps.begin(), steps.end(), [](const SequenceStep& s) { return s.device_tokens != nullptr; }))
    return ok_status();
  out.tokens.assign(steps.size(), {});
  out.steps.assign(steps.begin(), steps.end());
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].device_tokens) continue;
    KILN_RETURN_IF_ERROR(to_host(model, steps[i].device_tokens, steps[i].tokens.size(), out.tokens[i])
                             .with_context("a chained step's device tokens"));
    out.steps[i].tokens = out.tokens[i];
    out.steps[i].device_tokens = nullptr;
  }
  use = out.steps;
  return ok_status();
}

// The follower's copy of a call's steps: storage, and the SequenceSteps that view it.
struct DecodedSteps {
  std::vector<std::vector<int32_t>> tokens, tables;
  std::vector<std::vector<float>> media_rows;
  std::vector<std::vector<MediaRows>> media;
  std::vector<SequenceStep> steps;
};

Status read_steps(Reader& r, DecodedSteps& d) {
  uint64_t n = 0;
  KILN_RETURN_IF_ERROR(r.pod(n));
  d.tokens.resize(n);
  d.tables.resize(n);
  d.media.resize(n);
  d.steps.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    SequenceStep& s = d.steps[i];
    KILN_RETURN_IF_ERROR(r.array(d.tokens[i]));
    s.tokens = d.tokens[i];
    KILN_RETURN_IF_ERROR(r.pod(s.start_position));
    bool has_table = false;
    KILN_RETURN_IF_ERROR(r.pod(has_table));
    if (has_table) {
      KILN_RETURN_IF_ERROR(r.array(d.tables[i]));
      s.block_table = &d.tables[i];
    }
    KILN_RETURN_IF_ERROR(r.pod(s.all_logits));
    KILN_RETURN_IF_ERROR(r.pod(s.state_slot));
    KILN_RETURN_IF_ERROR(r.pod(s.prompt_length));
    uint64_t media = 0;
    KILN_RETURN_IF_ERROR(r.pod(media));
    for (uint64_t k = 0; k < media; ++k) {
      MediaRows m;
      KILN_RETURN_IF_ERROR(r.pod(m.first_row));
      KILN_RETURN_IF_ERROR(r.pod(m.count));
      d.media_rows.emplace_back();
      KILN_RETURN_IF_ERROR(r.array(d.media_rows.back()));
      d.media[i].push_back(m);
    }
  }
  // Pointers into media_rows only now that it no longer grows.
  size_t next = 0;
  for (uint64_t i = 0; i < n; ++i) {
    for (MediaRows& m : d.media[i]) m.embeddings = d.media_rows[next++].data();
    d.steps[i].media = d.media[i];
  }
  return ok_status();
}

void write_options(Writer& w, const StepOptions& o) {
  w.pod(o.want_logits);
  w.pod(o.want_hidden);
  w.array(o.tap_layers.data(), o.tap_layers.size());
  w.pod(o.record_router_margin);
}

Status read_options(Reader& r, StepOptions& o) {
  KILN_RETURN_IF_ERROR(r.pod(o.want_logits));
  KILN_RETURN_IF_ERROR(r.pod(o.want_hidden));
  KILN_RETURN_IF_ERROR(r.array(o.tap_layers));
  return r.pod(o.record_router_margin);
}

void write_view(Writer& w, const TensorView& t) {
  w.pod(t.dtype);
  w.pod(t.rank);
  w.pod(t.shape);
}

Status read_view(Reader& r, TensorView& t) {
  KILN_RETURN_IF_ERROR(r.pod(t.dtype));
  KILN_RETURN_IF_ERROR(r.pod(t.rank));
  KILN_RETURN_IF_ERROR(r.pod(t.shape));
  if (t.rank < 0 || t.rank > kMaxTensorRank) return data_loss("rank 0 sent a tensor of rank " + std::to_string(t.rank));
  int64_t s = 1;
  for (int k = t.rank - 1; k >= 0; --k) {
    t.strides[k] = s;
    s *= t.shape[k];
  }
  return ok_status();
}

int64_t numel(const TensorView& t) {
  int64_t n = 1;
  for (int k = 0; k < t.rank; ++k) n *= t.shape[k];
  return n;
}

Status failed_reply(const std::string& reply) {
  return Status(StatusCode::kInternal, reply.substr(1));
}

}  // namespace

Result<std::unique_ptr<TcpBootstrap>> connect_control_channel(const LaunchEnv& launch) {
  RendezvousSpec spec = rendezvous_spec(launch);
  spec.port = control_port(launch);
  auto channel = TcpBootstrap::connect(spec);
  if (!channel.ok()) return channel.status().with_context("the rank processes' control channel (MASTER_PORT + 1)");
  return channel;
}

// ---------------- rank 0 ----------------

RankLeaderInstance::RankLeaderInstance(std::unique_ptr<ModelInstance> own, std::unique_ptr<TcpBootstrap> control,
                                       std::function<void()> release, std::vector<SocketCollective*> groups)
    : own_(std::move(own)), control_(std::move(control)), release_(std::move(release)), groups_(std::move(groups)) {}

RankLeaderInstance::~RankLeaderInstance() {
  if (!broken_.ok()) return;
  Writer w;
  w.pod(CallKind::kStop);
  const std::string stop = w.take();
  for (int r = 1; r < world(); ++r) (void)control_->send(r, stop);
}

namespace {
std::mutex broken_handler_mu;
std::function<void(const Status&)> broken_handler;
}  // namespace

void set_group_broken_handler(std::function<void(const Status&)> handler) {
  std::lock_guard<std::mutex> lock(broken_handler_mu);
  broken_handler = std::move(handler);
}

Status RankLeaderInstance::mark_broken(const Status& why) {
  if (!broken_.ok()) return broken_;
  // Unavailable whatever broke it: the group is gone until a restart, which is no fault of the request (the server
  // answers 503 for it, and for every later one).
  broken_ = unavailable("the tensor-parallel group is broken (restart kiln): " + why.message());
  log::error("{}", broken_.message());
  if (release_) release_();
  std::lock_guard<std::mutex> lock(broken_handler_mu);
  if (broken_handler) broken_handler(broken_);
  return broken_;
}

void RankLeaderInstance::mirror_state_copy(const StateCopy& copy) {
  std::lock_guard<std::mutex> lock(copies_mu_);
  state_copies_.push_back(copy);
}

Status RankLeaderInstance::on_all_ranks(std::string call, const std::function<Status()>& mine, bool with_state_copies) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) {
    std::lock_guard<std::mutex> copies_lock(copies_mu_);
    state_copies_.clear();  // no follower will make them
    return broken_;
  }
  if (with_state_copies) {
    // Taken under mu_, so the followers see the copies in the order the calls around them were made. They go right
    // after the call's kind: a follower makes them before anything in the call can fail, so a failed call (the
    // group goes on) loses none.
    std::vector<StateCopy> copies;
    {
      std::lock_guard<std::mutex> copies_lock(copies_mu_);
      copies.swap(state_copies_);
    }
    Writer w;
    w.pod(static_cast<uint64_t>(copies.size()));
    for (const StateCopy& c : copies) {
      w.pod(reinterpret_cast<uint64_t>(c.pool));
      w.pod(c.layer);
      w.pod(static_cast<uint64_t>(c.entry));
      w.pod(static_cast<uint64_t>(c.from));
      w.pod(static_cast<uint64_t>(c.to));
      w.pod(static_cast<uint64_t>(c.bytes));
    }
    call.insert(sizeof(CallKind), w.take());
  }
  const int W = world();
  for (int r = 1; r < W; ++r) {
    Status sent = control_->send(r, call);
    if (!sent.ok())
      return mark_broken(unavailable("tensor-parallel rank " + std::to_string(r) + " is gone: " + sent.message()));
  }
  const Status own = mine();
  if (!groups_.empty()) {
    // Every rank ends the call (releasing those still in a meeting), then answers on the control channel.
    const Status verdict = SocketCollective::end_call(groups_, own);
    bool gone = false;
    for (const SocketCollective* g : groups_) gone |= !g->broken().ok();
    std::optional<std::chrono::milliseconds> wait;
    if (gone) wait = kFailureGrace;
    Status lost;
    for (int r = 1; r < W; ++r) {
      auto reply = control_->receive(r, wait);
      if (reply.ok() && !reply->empty()) continue;
      if (lost.ok())
        lost = unavailable("tensor-parallel rank " + std::to_string(r) + " did not finish the call: " +
                           (reply.ok() ? std::string("an empty reply") : reply.status().message()));
      wait = kFailureGrace;
    }
    if (gone || !lost.ok()) return mark_broken(gone ? verdict : lost);
    if (!verdict.ok()) return Status(verdict.code(), "tensor-parallel " + verdict.message());
    return ok_status();
  }
  // A failure here may have left the followers inside a collective: wait for them only briefly then.
  std::optional<std::chrono::milliseconds> wait;
  if (!own.ok()) wait = kFailureGrace;
  Status first_follower;  // the first follower's own failure
  bool in_step = true;    // every follower finished the call (so the ranks are still in step)
  for (int r = 1; r < W; ++r) {
    auto reply = control_->receive(r, wait);
    if (!reply.ok() || reply->empty()) {
      in_step = false;
      if (first_follower.ok())
        first_follower = unavailable("tensor-parallel rank " + std::to_string(r) + " did not finish the call: " +
                                     (reply.ok() ? std::string("an empty reply") : reply.status().message()));
      wait = kFailureGrace;  // one is gone: the others may be waiting for it
      continue;
    }
    if ((*reply)[0] == kFailed) {
      in_step = false;
      if (first_follower.ok() || first_follower.message().find("did not finish") != std::string::npos)
        first_follower = failed_reply(*reply).with_context("tensor-parallel rank " + std::to_string(r));
      wait = kFailureGrace;
    }
  }
  if (own.ok() && in_step) return ok_status();
  // Prefer a follower's own error over rank 0's report that it lost the follower in a collective.
  Status failed = !first_follower.ok() && (own.ok() || own.message().find("collective `socket`") != std::string::npos)
                      ? first_follower
                      : own.with_context("tensor-parallel rank 0");
  return in_step ? failed : mark_broken(failed);
}

Status RankLeaderInstance::step(std::span<const SequenceStep> steps, std::span<const TokenSelection> select,
                                const CacheViews& caches, const StepOptions& options, StepOutput& out) {
  HostTokenSteps staged;
  KILN_RETURN_IF_ERROR(stage_device_tokens(*own_, steps, staged, steps));
  Writer w;
  w.pod(CallKind::kStep);
  KILN_RETURN_IF_ERROR(write_steps(w, *own_, steps));
  write_options(w, options);
  write_pool(w, caches);
  return on_all_ranks(
      w.take(),
      [&] {
        injected_step_hang(0);
        return own_->step(steps, select, caches, options, out);
      },
      /*with_state_copies=*/true);
}

Status RankLeaderInstance::mtp_step(int64_t layer, std::span<const SequenceStep> steps, const float* hidden,
                                    const CacheViews& caches, MtpStepOutput& out) {
  HostTokenSteps staged;
  KILN_RETURN_IF_ERROR(stage_device_tokens(*own_, steps, staged, steps));
  size_t tokens = 0;
  for (const SequenceStep& s : steps) tokens += s.tokens.size();
  std::vector<float> rows;
  KILN_RETURN_IF_ERROR(to_host(*own_, hidden, tokens * static_cast<size_t>(hidden_size()), rows));
  Writer w;
  w.pod(CallKind::kMtpStep);
  w.pod(layer);
  KILN_RETURN_IF_ERROR(write_steps(w, *own_, steps));
  w.array(rows.data(), rows.size());
  write_pool(w, caches);
  return on_all_ranks(
      w.take(), [&] { return own_->mtp_step(layer, steps, hidden, caches, out); }, /*with_state_copies=*/true);
}

Status RankLeaderInstance::embed(const int32_t* ids, int64_t n, TensorView out) {
  std::vector<int32_t> host;
  KILN_RETURN_IF_ERROR(to_host(*own_, ids, static_cast<size_t>(n), host));
  Writer w;
  w.pod(CallKind::kEmbed);
  w.array(host.data(), host.size());
  write_view(w, out);
  return on_all_ranks(w.take(), [&] { return own_->embed(ids, n, out); });
}

Status RankLeaderInstance::lm_head(const TensorView& hidden, float* logits) {
  const int64_t count = numel(hidden);
  std::string bytes(static_cast<size_t>(count) * dtype_size(hidden.dtype), '\0');
  if (!bytes.empty()) KILN_RETURN_IF_ERROR(own_->device_context().copy(bytes.data(), hidden.data, bytes.size(), true));
  Writer w;
  w.pod(CallKind::kLmHead);
  write_view(w, hidden);
  w.array(bytes.data(), bytes.size());
  return on_all_ranks(w.take(), [&] { return own_->lm_head(hidden, logits); });
}

// ---------------- followers ----------------

namespace {

// A follower's pools, each mirroring one of rank 0's.
class MirroredPools {
 public:
  explicit MirroredPools(ModelInstance& model) : model_(model) {}

  Result<const CacheViews*> read(Reader& r) {
    uint64_t id = 0, layers = 0;
    CacheViews shape;
    KILN_RETURN_IF_ERROR(r.pod(id));
    KILN_RETURN_IF_ERROR(r.pod(shape.num_blocks));
    KILN_RETURN_IF_ERROR(r.pod(shape.block_size));
    KILN_RETURN_IF_ERROR(r.pod(layers));
    std::vector<std::vector<uint64_t>> bytes(layers);
    for (auto& l : bytes) KILN_RETURN_IF_ERROR(r.array(l));
    auto it = pools_.find(id);
    if (it != pools_.end()) {
      if (it->second.num_blocks != shape.num_blocks || it->second.block_size != shape.block_size ||
          it->second.layers.size() != layers)
        return failed_precondition("rank 0's KV pool changed its geometry");
      return &it->second;
    }
    CacheViews& pool = pools_[id];
    pool.num_blocks = shape.num_blocks;
    pool.block_size = shape.block_size;
    pool.layout = layout_;
    pool.layers.resize(layers);
    pool.bytes.resize(layers);
    size_t total = 0;
    for (size_t l = 0; l < layers; ++l) {
      for (uint64_t b : bytes[l]) {
        void* p = nullptr;
        if (b > 0) {
          const std::string what = "rank KV pool layer " + std::to_string(l);
          KILN_ASSIGN_OR_RETURN(p, model_.device_context().allocate(b, what.c_str()));
          if (model_.device().is_cpu()) std::memset(p, 0, b);
        }
        pool.layers[l].push_back(p);
        pool.bytes[l].push_back(b);
        total += b;
      }
    }
    log::info("this rank's KV pool: {} blocks of {} tokens, {} layers, {:.1f} MiB (rank 0's geometry)",
              pool.num_blocks, pool.block_size, layers, total / 1048576.0);
    return &pool;
  }
  void set_layout(const KvLayout* layout) { layout_ = layout; }

  // Makes in this rank's pools the state copies rank 0 made in its own since its last step (sent first in a step or
  // MTP step, after its kind).
  Status copy_state(Reader& r) {
    uint64_t n = 0;
    KILN_RETURN_IF_ERROR(r.pod(n));
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t id = 0, entry = 0, from = 0, to = 0, bytes = 0;
      int64_t layer = 0;
      KILN_RETURN_IF_ERROR(r.pod(id));
      KILN_RETURN_IF_ERROR(r.pod(layer));
      KILN_RETURN_IF_ERROR(r.pod(entry));
      KILN_RETURN_IF_ERROR(r.pod(from));
      KILN_RETURN_IF_ERROR(r.pod(to));
      KILN_RETURN_IF_ERROR(r.pod(bytes));
      auto it = pools_.find(id);
      // A pool no step has used yet holds no sequence's state: there is nothing to copy.
      if (it == pools_.end()) continue;
      const CacheViews& pool = it->second;
      char* base = static_cast<char*>(pool.entry(layer, entry));
      const uint64_t size = base ? pool.bytes[layer][entry] : 0;
      const uint64_t apart = from > to ? from - to : to - from;
      if (!base || bytes > size || from > size - bytes || to > size - bytes || (apart < bytes && apart > 0))
        return data_loss("rank 0 sent a state copy outside layer " + std::to_string(layer) + " entry " +
                         std::to_string(entry) + " of its pool (" + std::to_string(bytes) + " bytes from " +
                         std::to_string(from) + " to " + std::to_string(to) + " in " + std::to_string(size) + ")");
      if (bytes > 0 && from != to)
        KILN_RETURN_IF_ERROR(model_.device_context().copy(base + to, base + from, bytes, /*wait=*/false));
    }
    return ok_status();
  }

 private:
  ModelInstance& model_;
  const KvLayout* layout_ = nullptr;
  std::map<uint64_t, CacheViews> pools_;
};

// A follower's device memory for the calls' inputs and outputs, grown as they need (never freed: device memory
// lives as long as the model, and a drafter's batches grow to a bound).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(ModelInstance& model) : model_(model) {}
  Result<char*> at_least(size_t bytes) {
    if (bytes > bytes_) {
      const size_t want = std::max(bytes, 2 * bytes_);
      KILN_ASSIGN_OR_RETURN(void* p, model_.device_context().allocate(want, "rank call buffer"));
      data_ = static_cast<char*>(p);
      bytes_ = want;
    }
    return data_;
  }

 private:
  ModelInstance& model_;
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

std::vector<SocketCollective*> socket_call_groups(Collective* tensor_parallel, Collective* decode_context) {
  std::vector<SocketCollective*> groups;
  auto* tp = dynamic_cast<SocketCollective*>(host_side(tensor_parallel));
  if (!tp) return groups;
  groups.push_back(tp);
  if (decode_context) {
    auto* dc = dynamic_cast<SocketCollective*>(host_side(decode_context));
    if (!dc) return {};
    groups.push_back(dc);
  }
  return groups;
}

Status report_rank_loaded(TcpBootstrap& control, const Status& built, uint64_t weight_bytes) {
  if (!built.ok()) return control.send(0, std::string(1, kFailed) + built.message());
  Writer w;
  w.pod(kDone);
  w.pod(weight_bytes);
  return control.send(0, w.take());
}

Result<uint64_t> wait_for_ranks_loaded(TcpBootstrap& control) {
  uint64_t largest = 0;
  for (int r = 1; r < control.world_size(); ++r) {
    // As long as loading may take (the rendezvous timeout), but a rank that exits is seen at once.
    auto reply = control.receive(r);
    if (!reply.ok())
      return reply.status().with_context("tensor-parallel rank " + std::to_string(r) + " did not finish loading");
    if (reply->empty() || (*reply)[0] != kDone)
      return failed_reply(reply->empty() ? std::string(1, kFailed) + "an empty reply" : *reply)
          .with_context("tensor-parallel rank " + std::to_string(r) + " could not load");
    uint64_t bytes = 0;
    if (reply->size() >= 1 + sizeof bytes) std::memcpy(&bytes, reply->data() + 1, sizeof bytes);
    largest = std::max(largest, bytes);
  }
  return largest;
}

Status run_rank_follower(ModelInstance& model, TcpBootstrap& control, const KvLayout* layout,
                         std::vector<SocketCollective*> groups) {
  MirroredPools pools(model);
  pools.set_layout(layout);
  StepOutput out;
  MtpStepOutput mtp_out;
  std::vector<float> buffer;
  // A model on a device (CUDA ranks) reads a drafter's embedding ids and lm_head rows there and writes there.
  const bool on_device = !model.device().is_cpu();
  DeviceBuffer device_buffer(model);
  for (;;) {
    auto call = control.receive(0, std::chrono::milliseconds(-1));  // idle between requests for as long as it takes
    if (!call.ok()) return call.status().with_context("rank " + std::to_string(control.rank()) + " lost rank 0");
    Reader r(*call);
    CallKind kind{};
    KILN_RETURN_IF_ERROR(r.pod(kind));
    if (kind == CallKind::kStop) return ok_status();
    Status done = [&]() -> Status {
      switch (kind) {
        case CallKind::kStep: {
          KILN_RETURN_IF_ERROR(pools.copy_state(r));
          KILN_RETURN_IF_ERROR(injected_step_fault(control.rank()));
          injected_step_hang(control.rank());
          DecodedSteps d;
          StepOptions options;
          KILN_RETURN_IF_ERROR(read_steps(r, d));
          KILN_RETURN_IF_ERROR(read_options(r, options));
          KILN_ASSIGN_OR_RETURN(const CacheViews* caches, pools.read(r));
          return model.step(d.steps, {}, *caches, options, out);
        }
        case CallKind::kMtpStep: {
          KILN_RETURN_IF_ERROR(pools.copy_state(r));
          int64_t layer = 0;
          DecodedSteps d;
          std::vector<float> hidden;
          KILN_RETURN_IF_ERROR(r.pod(layer));
          KILN_RETURN_IF_ERROR(read_steps(r, d));
          KILN_RETURN_IF_ERROR(r.array(hidden));
          KILN_ASSIGN_OR_RETURN(const CacheViews* caches, pools.read(r));
          return model.mtp_step(layer, d.steps, hidden.data(), *caches, mtp_out);
        }
        case CallKind::kEmbed: {
          std::vector<int32_t> ids;
          TensorView view;
          KILN_RETURN_IF_ERROR(r.array(ids));
          KILN_RETURN_IF_ERROR(read_view(r, view));
          const size_t out_bytes = static_cast<size_t>(numel(view)) * dtype_size(view.dtype);
          if (on_device) {  // the ids and the rows where the model reads and writes them
            KILN_ASSIGN_OR_RETURN(char* dev, device_buffer.at_least(ids.size() * sizeof(int32_t) + out_bytes));
            KILN_RETURN_IF_ERROR(model.device_context().copy(dev, ids.data(), ids.size() * sizeof(int32_t), false));
            view.data = dev + ids.size() * sizeof(int32_t);
            view.device = model.device();
            return model.embed(reinterpret_cast<const int32_t*>(dev), static_cast<int64_t>(ids.size()), view);
          }
          buffer.resize((out_bytes + 3) / 4);
          view.data = buffer.data();
          return model.embed(ids.data(), static_cast<int64_t>(ids.size()), view);
        }
        case CallKind::kLmHead: {
          TensorView view;
          std::vector<char> rows;
          KILN_RETURN_IF_ERROR(read_view(r, view));
          KILN_RETURN_IF_ERROR(r.array(rows));
          const int64_t n = model.hidden_size() > 0 ? numel(view) / model.hidden_size() : 0;
          const size_t logits_bytes = static_cast<size_t>(n * model.vocab_size()) * sizeof(float);
          if (on_device) {
            // The rows' bytes rounded up to 256, so that the logits after them are aligned.
            const size_t rows_bytes = (rows.size() + 255) / 256 * 256;
            KILN_ASSIGN_OR_RETURN(char* dev, device_buffer.at_least(rows_bytes + logits_bytes));
            KILN_RETURN_IF_ERROR(model.device_context().copy(dev, rows.data(), rows.size(), false));
            view.data = dev;
            view.device = model.device();
            return model.lm_head(view, reinterpret_cast<float*>(dev + rows_bytes));
          }
          view.data = rows.data();
          buffer.resize(static_cast<size_t>(n * model.vocab_size()));
          return model.lm_head(view, buffer.data());
        }
        default:
          return data_loss("rank 0 sent an unknown call (" + std::to_string(static_cast<int>(kind)) + ")");
      }
    }();
    if (!groups.empty()) {
      // Every rank ends the call; the group goes on unless a rank is gone.
      (void)SocketCollective::end_call(groups, done);
      for (const SocketCollective* g : groups)
        if (!g->broken().ok()) {
          // This rank's own error in the call says what happened (e.g. which rank did not arrive); the broken
          // group's only how this rank learnt it.
          const Status why = done.ok() ? g->broken() : done;
          (void)control.send(0, std::string(1, kFailed) + why.message());
          return why;
        }
      if (!done.ok())
        log::warn("tensor-parallel rank {}: a call failed here ({}); the group goes on", control.rank(), done.message());
      KILN_RETURN_IF_ERROR(control.send(0, done.ok() ? std::string(1, kDone) : std::string(1, kFailed) + done.message()));
      continue;
    }
    if (!done.ok()) {
      (void)control.send(0, std::string(1, kFailed) + done.message());
      return done;
    }
    KILN_RETURN_IF_ERROR(control.send(0, std::string(1, kDone)));
  }
}

}  // namespace kiln
