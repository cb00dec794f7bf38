#include "parallel/socket_collective.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "kernels/cpu/half_float.h"
#include "kiln/launch_env.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda/host_staged_collective.h"
#endif

namespace kiln {
namespace {

enum class Op : uint8_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast };

// The status word of a message to rank 0: an operand for the meeting, or this rank's verdict on a call it has left.
enum : uint8_t { kOperand = 0, kLeft = 1 };

// What every rank must agree on, sent ahead of its operand.
struct Header {
  uint32_t call = 0;  // the sender's count of ended calls
  uint8_t kind = kOperand;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t reduce = 0;  // ReduceOp
  int32_t root = 0;
  int32_t pad = 0;
  int64_t count = 0;
};

Header header(Op op, DType dtype, uint8_t reduce, int32_t root, int64_t count) {
  Header h;
  h.op = static_cast<uint8_t>(op);
  h.dtype = static_cast<uint8_t>(dtype);
  h.reduce = reduce;
  h.root = root;
  h.count = count;
  return h;
}

bool same_call(const Header& a, const Header& b) {
  return a.op == b.op && a.dtype == b.dtype && a.reduce == b.reduce && a.root == b.root && a.count == b.count;
}

Status need_host(const Stream& stream, const char* call) {
  if (!stream.device.is_cpu())
    return failed_precondition(std::string("collective `socket`: ") + call + " on " + stream.device.to_string() +
                               " (its ranks are CPU processes; host memory only: use `nccl` on GPUs)");
  return ok_status();
}

Status need_reducible(DType dtype, const char* call) {
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    return invalid_argument(std::string("collective `socket`: ") + call + " reduces fp32 and bf16, got " +
                            dtype_name(dtype));
  return ok_status();
}

float load(const char* p, DType dtype, int64_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + i * 2, 2);
  return cpu::bf16_to_float(h);
}

void store(char* p, DType dtype, int64_t i, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(p + i * 4, &v, 4);
  } else {
    const uint16_t h = cpu::float_to_bf16(v);
    std::memcpy(p + i * 2, &h, 2);
  }
}

// Elements [begin, begin + n) of every rank's operand combined in rank order, fp32 accumulation, one rounding.
std::string reduce_in_rank_order(const std::vector<std::string>& in, DType dtype, bool max, int64_t begin, int64_t n) {
  std::string out(static_cast<size_t>(n) * dtype_size(dtype), '\0');
  for (int64_t i = 0; i < n; ++i) {
    float acc = load(in[0].data(), dtype, begin + i);
    for (size_t r = 1; r < in.size(); ++r) {
      const float v = load(in[r].data(), dtype, begin + i);
      acc = max ? (v > acc ? v : acc) : acc + v;
    }
    store(out.data(), dtype, i, acc);
  }
  return out;
}

std::string pack(const Header& h, const void* data, size_t bytes) {
  std::string blob(sizeof h + bytes, '\0');
  std::memcpy(blob.data(), &h, sizeof h);
  if (bytes) std::memcpy(blob.data() + sizeof h, data, bytes);
  return blob;
}

const char* op_name(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kBroadcast: return "broadcast";
  }
  return "?";
}

std::string describe(const Header& h) {
  return std::string(op_name(h.op)) + " of " + std::to_string(h.count) + " " + dtype_name(static_cast<DType>(h.dtype));
}

// Replies from rank 0: [0][result] or [1][int32 code][message] (a failed meeting, or a failed call's verdict).
std::string ok_reply(const std::string& result) { return std::string(1, '\0') + result; }

std::string error_reply(const Status& s) {
  std::string out(1, '\1');
  const int32_t code = static_cast<int32_t>(s.code());
  out.append(reinterpret_cast<const char*>(&code), sizeof code);
  return out + s.message();
}

Result<std::string> parse_reply(const std::string& reply) {
  if (reply.empty()) return data_loss("collective `socket`: an empty reply from rank 0");
  if (reply[0] == 0) return reply.substr(1);
  int32_t code = static_cast<int32_t>(StatusCode::kUnavailable);
  if (reply.size() >= 1 + sizeof code) std::memcpy(&code, reply.data() + 1, sizeof code);
  if (code <= 0 || code > static_cast<int32_t>(StatusCode::kInternal)) code = static_cast<int32_t>(StatusCode::kInternal);
  return Status(static_cast<StatusCode>(code), reply.size() > 1 + sizeof code ? reply.substr(1 + sizeof code) : "");
}

}  // namespace

// A rank's verdict on a call it has left: how it went there, and whether the failure was its own (not the echo of
// a meeting another rank failed).
struct SocketCollective::Left {
  Status status;
  bool primary = false;

  std::string encode() const {
    std::string out;
    out.push_back(static_cast<char>(primary));
    const int32_t code = static_cast<int32_t>(status.code());
    out.append(reinterpret_cast<const char*>(&code), sizeof code);
    return out + status.message();
  }
  static Left decode(const std::string& in) {
    Left l;
    int32_t code = 0;
    if (in.size() < 1 + sizeof code) return {internal_error("a truncated verdict"), true};
    l.primary = in[0] != 0;
    std::memcpy(&code, in.data() + 1, sizeof code);
    if (code < 0 || code > static_cast<int32_t>(StatusCode::kInternal)) code = static_cast<int32_t>(StatusCode::kInternal);
    if (code != 0) l.status = Status(static_cast<StatusCode>(code), in.substr(1 + sizeof code));
    return l;
  }
};

namespace {

// Why a meeting cannot happen when rank r has left the call.
std::string left_reason(int r, const Status& status, const Header& meeting) {
  if (!status.ok()) return "rank " + std::to_string(r) + " failed: " + status.message();
  return "rank " + std::to_string(r) + " ended the call without this " + describe(meeting) + " (the ranks disagree on the call)";
}

}  // namespace

struct SocketCollective::Call {
  Header header;
  // Rank 0: every rank's operand (rank order, headers stripped) → each rank's result.
  std::function<std::vector<std::string>(const std::vector<std::string>&)> combine;
};

SocketCollective::SocketCollective(std::unique_ptr<TcpBootstrap> channel, std::chrono::milliseconds call_timeout)
    : channel_(std::move(channel)),
      call_timeout_(call_timeout.count() > 0 ? call_timeout : channel_->timeout()),
      left_(channel_->world_size()) {}

SocketCollective::~SocketCollective() = default;

Result<std::unique_ptr<SocketCollective>> SocketCollective::connect(const RendezvousSpec& spec,
                                                                     std::chrono::milliseconds call_timeout) {
  KILN_ASSIGN_OR_RETURN(auto channel, TcpBootstrap::connect(spec));
  return std::make_unique<SocketCollective>(std::move(channel), call_timeout);
}

KeySpec transport_timeout_key() {
  KeySpec k;
  k.name = "timeout_s";
  k.type = ValueType::kInteger;
  k.default_value = int64_t{300};
  k.min = 1;
  k.max = 24 * 3600;
  k.doc = "seconds a rank may wait for the others in one collective call (a rank that hangs): then the call fails on "
          "every rank still alive, naming the ranks that did not arrive, and the tensor-parallel group ends";
  return k;
}

std::string missing_ranks_message(const std::string& meeting, const std::vector<int>& missing,
                                  std::chrono::milliseconds timeout) {
  std::string ranks;
  for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const auto ms = timeout.count();
  const std::string bound = ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
  return meeting + ": rank" + (missing.size() == 1 ? " " : "s ") + ranks + " did not arrive within transport.timeout_s = " +
         bound + " (hung, or far slower than the others)";
}

std::vector<int> SocketCollective::not_arrived(std::vector<int> ranks,
                                               std::chrono::steady_clock::time_point deadline) const {
  while (!ranks.empty()) {
    std::vector<pollfd> fds;
    for (int r : ranks) fds.push_back({channel_->native_handle(r), POLLIN, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ranks;
    std::vector<int> still;
    for (size_t i = 0; i < fds.size(); ++i)
      if (!fds[i].revents) still.push_back(ranks[i]);
    if (n == 0) return still;  // the deadline passed
    ranks = std::move(still);
  }
  return {};
}

Status SocketCollective::break_group(const Status& why) {
  if (broken_.ok()) {
    broken_ = Status(why.code(), "collective `socket`: " + why.message());
    channel_->shut_down();
  }
  return broken_;
}

Result<std::string> SocketCollective::meet(const Call& call, std::string operand) {
  if (!broken_.ok()) return broken_;
  const int world = world_size();
  Header mine = call.header;
  mine.call = call_;
  mine.kind = kOperand;
  const std::string meeting = describe(mine) + " in call " + std::to_string(call_);
  if (rank() != 0) {
    if (Status s = channel_->send(0, pack(mine, operand.data(), operand.size())); !s.ok()) return break_group(s);
    auto reply = channel_->receive(0, leader_wait());
    if (!reply.ok()) return break_group(Status(reply.status().code(), meeting + ": " + reply.status().message()));
    auto result = parse_reply(*reply);
    if (!result.ok()) {
      meeting_failed_ = true;
      return Status(result.status().code(), "collective `socket`: " + result.status().message());
    }
    return result;
  }
  std::vector<std::string> operands(world);
  operands[0] = std::move(operand);
  // Every rank still in the call within the bound, or the meeting fails on the ranks that came, naming the others.
  std::vector<int> expected;
  for (int r = 1; r < world; ++r)
    if (!left_[r]) expected.push_back(r);
  if (const std::vector<int> missing =
          not_arrived(expected, std::chrono::steady_clock::now() + call_timeout_);
      !missing.empty()) {
    const Status why = unavailable(missing_ranks_message(meeting, missing, call_timeout_));
    for (int r : expected)
      if (std::find(missing.begin(), missing.end(), r) == missing.end())
        (void)channel_->send(r, error_reply(why));
    return break_group(why);
  }
  std::string failure;  // why this meeting fails on every rank still in it
  for (int r = 1; r < world; ++r) {
    if (left_[r]) {
      if (failure.empty()) failure = left_reason(r, left_[r]->status, mine);
      continue;
    }
    auto blob = channel_->receive(r);
    if (!blob.ok()) {
      // Rank r is gone: tell the ranks already heard from why (they fail at once instead of seeing a closed
      // connection), then close everything.
      const Status why = unavailable("rank " + std::to_string(r) + " failed: " + blob.status().message());
      for (int q = 1; q < world; ++q)
        if (q != r && !left_[q]) (void)channel_->send(q, error_reply(Status(why.code(), why.message())));
      return break_group(why);
    }
    Header h;
    if (blob->size() < sizeof h) return break_group(data_loss("a short message from rank " + std::to_string(r)));
    std::memcpy(&h, blob->data(), sizeof h);
    if (h.call != call_)
      return break_group(data_loss("rank " + std::to_string(r) + " is in call " + std::to_string(h.call) + ", rank 0 in call " +
                                   std::to_string(call_) + " (the ranks are out of step)"));
    if (h.kind == kLeft) {
      left_[r] = std::make_unique<Left>(Left::decode(blob->substr(sizeof h)));
      if (failure.empty()) failure = left_reason(r, left_[r]->status, mine);
      continue;
    }
    if (failure.empty() && !same_call(h, mine))
      failure = "ranks disagree on the call (rank 0: " + describe(mine) + "; rank " + std::to_string(r) + ": " +
                describe(h) + ")";
    operands[r] = blob->substr(sizeof h);
  }
  if (!failure.empty()) {
    meeting_failed_ = true;
    const Status failed = unavailable(failure);
    for (int r = 1; r < world; ++r)
      if (!left_[r])
        if (Status s = channel_->send(r, error_reply(failed)); !s.ok()) return break_group(s);
    return Status(failed.code(), "collective `socket`: " + failure);
  }
  std::vector<std::string> results = call.combine(operands);
  for (int r = 1; r < world; ++r)
    if (Status s = channel_->send(r, ok_reply(results[r])); !s.ok()) return break_group(s);
  return std::move(results[0]);
}

// ---- ending a call ----

Status SocketCollective::announce_end(const Status& mine, bool primary) {
  Header h;
  h.call = call_;
  h.kind = kLeft;
  const std::string verdict = Left{mine, primary}.encode();
  if (Status s = channel_->send(0, pack(h, verdict.data(), verdict.size())); !s.ok()) return break_group(s);
  return ok_status();
}

Status SocketCollective::take_message_while_ending(int peer, const Status& mine) {
  auto blob = channel_->receive(peer);
  if (!blob.ok()) return break_group(unavailable("rank " + std::to_string(peer) + " failed: " + blob.status().message()));
  Header h;
  if (blob->size() < sizeof h) return break_group(data_loss("a short message from rank " + std::to_string(peer)));
  std::memcpy(&h, blob->data(), sizeof h);
  if (h.call != call_)
    return break_group(data_loss("rank " + std::to_string(peer) + " is in call " + std::to_string(h.call) +
                                 ", rank 0 in call " + std::to_string(call_) + " (the ranks are out of step)"));
  if (h.kind == kLeft) {
    left_[peer] = std::make_unique<Left>(Left::decode(blob->substr(sizeof h)));
    return ok_status();
  }
  // The rank waits in a meeting this rank has left: fail it there (it ends its call next).
  const Status why = unavailable("rank 0 " + (mine.ok() ? std::string("ended the call without this ") + describe(h) +
                                                              " (the ranks disagree on the call)"
                                                        : "failed: " + mine.message()));
  if (Status s = channel_->send(peer, error_reply(why)); !s.ok()) return break_group(s);
  return ok_status();
}

Status SocketCollective::send_verdict(const Status& mine, bool primary) {
  const int world = world_size();
  // The first rank that failed on its own; else (every failure an echo, e.g. ranks that disagreed) the first failure.
  Status verdict;
  auto consider = [&](int r, const Status& s, bool own, bool want_own) {
    if (verdict.ok() && !s.ok() && (own || !want_own)) verdict = Status(s.code(), "rank " + std::to_string(r) + ": " + s.message());
  };
  for (bool want_own : {true, false}) {
    consider(0, mine, primary, want_own);
    for (int r = 1; r < world; ++r) consider(r, left_[r]->status, left_[r]->primary, want_own);
  }
  for (int r = 1; r < world; ++r)
    if (Status s = channel_->send(r, verdict.ok() ? ok_reply("") : error_reply(verdict)); !s.ok()) return break_group(s);
  for (auto& l : left_) l.reset();
  ++call_;
  meeting_failed_ = false;
  return verdict;
}

Status SocketCollective::receive_verdict() {
  auto reply = channel_->receive(0, leader_wait());
  if (!reply.ok()) return break_group(reply.status());
  ++call_;
  meeting_failed_ = false;
  return parse_reply(*reply).status();
}

Status SocketCollective::end_call(std::span<SocketCollective* const> groups, const Status& mine) {
  bool echo = false;  // this rank's failure came out of a meeting another rank failed
  for (SocketCollective* g : groups) echo |= g->meeting_failed_;
  const bool primary = !mine.ok() && !echo;
  auto active = [](SocketCollective* g) { return g->world_size() > 1 && g->broken_.ok(); };

  // 1. Say so in every group this rank does not lead, before waiting for anything: a leader waiting for this rank
  //    in a meeting learns at once that it has left.
  for (SocketCollective* g : groups)
    if (active(g) && g->rank() != 0) (void)g->announce_end(mine, primary);

  // 2. Every group this rank leads: take each rank's next message — its verdict, or an operand for a meeting this
  //    rank has left (which then fails there) — from all groups at once, so that no rank waits on a group this
  //    rank would only reach later.
  struct Pending {
    SocketCollective* group;
    int peer;
  };
  auto pending = [&] {
    std::vector<Pending> out;
    for (SocketCollective* g : groups)
      if (active(g) && g->rank() == 0)
        for (int r = 1; r < g->world_size(); ++r)
          if (!g->left_[r]) out.push_back({g, r});
    return out;
  };
  std::chrono::milliseconds timeout{0};
  for (SocketCollective* g : groups) timeout = std::max(timeout, g->call_timeout_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::vector<Pending> wait = pending(); !wait.empty(); wait = pending()) {
    std::vector<pollfd> fds;
    for (const Pending& p : wait) fds.push_back({p.group->channel_->native_handle(p.peer), POLLIN, 0});
    const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(left_ms.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      for (SocketCollective* g : groups) {
        std::vector<int> missing;
        for (const Pending& p : wait)
          if (p.group == g) missing.push_back(p.peer);
        if (!missing.empty())
          (void)g->break_group(
              unavailable(missing_ranks_message("the end of call " + std::to_string(g->call_), missing, timeout)));
      }
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents && wait[i].group->broken_.ok()) (void)wait[i].group->take_message_while_ending(wait[i].peer, mine);
  }

  // 3. The verdicts: sent in the groups this rank leads, received in the others.
  Status first;
  for (size_t i = 0; i < groups.size(); ++i) {
    SocketCollective* g = groups[i];
    if (!active(g)) continue;
    const Status v = g->rank() == 0 ? g->send_verdict(mine, primary) : Status();
    if (i == 0 && g->rank() == 0) first = v;
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    SocketCollective* g = groups[i];
    if (!active(g) || g->rank() == 0) continue;
    const Status v = g->receive_verdict();
    if (i == 0) first = v;
  }
  for (SocketCollective* g : groups)
    if (!g->broken_.ok()) return g->broken_;
  if (groups.empty() || groups[0]->world_size() == 1) return mine;
  return first;
}

Status SocketCollective::all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) {
  KILN_RETURN_IF_ERROR(need_host(stream, "all_reduce"));
  KILN_RETURN_IF_ERROR(need_reducible(dtype, "all_reduce"));
  if (count < 0) return invalid_argument("collective `socket`: negative element count");
  if (world_size() == 1) return ok_status();
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  Call call{header(Op::kAllReduce, dtype, static_cast<uint8_t>(op), 0, count),
            [&](const std::vector<std::string>& in) {
              return std::vector<std::string>(in.size(), reduce_in_rank_order(in, dtype, op == ReduceOp::kMax, 0, count));
            }};
  KILN_ASSIGN_OR_RETURN(std::string result, meet(call, std::string(static_cast<const char*>(buffer), bytes)));
  if (result.size() != bytes) return data_loss("collective `socket`: all_reduce result of the wrong size");
  if (bytes) std::memcpy(buffer, result.data(), bytes);
  return ok_status();
}

Status SocketCollective::all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) {
  KILN_RETURN_IF_ERROR(need_host(stream, "all_gather"));
  if (count < 0) return invalid_argument("collective `socket`: negative element count");
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  if (world_size() == 1) {
    if (bytes) std::memmove(out, in, bytes);
    return ok_status();
  }
  Call call{header(Op::kAllGather, dtype, 0, 0, count),
            [&](const std::vector<std::string>& parts) {
              std::string all;
              for (const std::string& p : parts) all += p;
              return std::vector<std::string>(parts.size(), all);
            }};
  KILN_ASSIGN_OR_RETURN(std::string result, meet(call, std::string(static_cast<const char*>(in), bytes)));
  if (result.size() != bytes * world_size()) return data_loss("collective `socket`: all_gather result of the wrong size");
  if (!result.empty()) std::memcpy(out, result.data(), result.size());
  return ok_status();
}

Status SocketCollective::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                                        Stream stream) {
  KILN_RETURN_IF_ERROR(need_host(stream, "reduce_scatter"));
  KILN_RETURN_IF_ERROR(need_reducible(dtype, "reduce_scatter"));
  if (count < 0) return invalid_argument("collective `socket`: negative element count");
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  if (world_size() == 1) {
    if (bytes) std::memmove(out, in, bytes);
    return ok_status();
  }
  Call call{header(Op::kReduceScatter, dtype, static_cast<uint8_t>(op), 0, count),
            [&](const std::vector<std::string>& all) {
              std::vector<std::string> chunks(all.size());
              for (size_t r = 0; r < all.size(); ++r)
                chunks[r] = reduce_in_rank_order(all, dtype, op == ReduceOp::kMax, static_cast<int64_t>(r) * count, count);
              return chunks;
            }};
  KILN_ASSIGN_OR_RETURN(std::string result,
                        meet(call, std::string(static_cast<const char*>(in), bytes * world_size())));
  if (result.size() != bytes) return data_loss("collective `socket`: reduce_scatter result of the wrong size");
  if (bytes) std::memcpy(out, result.data(), bytes);
  return ok_status();
}

Status SocketCollective::broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) {
  KILN_RETURN_IF_ERROR(need_host(stream, "broadcast"));
  if (root < 0 || root >= world_size())
    return out_of_range("collective `socket`: broadcast root " + std::to_string(root) + " is not one of the " +
                        std::to_string(world_size()) + " ranks");
  if (count < 0) return invalid_argument("collective `socket`: negative element count");
  if (world_size() == 1) return ok_status();
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  Call call{header(Op::kBroadcast, dtype, 0, root, count),
            [&](const std::vector<std::string>& all) { return std::vector<std::string>(all.size(), all[root]); }};
  // Only the root's bytes travel to rank 0.
  std::string mine = rank() == root ? std::string(static_cast<const char*>(buffer), bytes) : std::string();
  KILN_ASSIGN_OR_RETURN(std::string result, meet(call, std::move(mine)));
  if (result.size() != bytes) return data_loss("collective `socket`: broadcast result of the wrong size");
  if (bytes) std::memcpy(buffer, result.data(), bytes);
  return ok_status();
}

Result<std::unique_ptr<Collective>> create_socket_collective(const CreateContext& context) {
  KILN_ASSIGN_OR_RETURN(const LaunchEnv launch, read_launch_env(process_env()));
  const auto timeout = std::chrono::seconds(context.section ? context.section->get_int("timeout_s", 300) : 300);
  KILN_ASSIGN_OR_RETURN(auto collective, SocketCollective::connect(rendezvous_spec(launch), timeout));
  if (context.device.is_cuda()) {
#ifdef KILN_WITH_CUDA
    // Device buffers: staged through pinned host memory (a correctness path, not a fast one: see that header).
    return std::unique_ptr<Collective>(new cuda::HostStagedCollective(std::move(collective)));
#else
    return unimplemented("collective `socket` on " + context.device.to_string() + ": this kiln was built without CUDA");
#endif
  }
  return std::unique_ptr<Collective>(std::move(collective));
}

}  // namespace kiln
