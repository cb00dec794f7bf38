#include "parallel/socket_collective.h"

#include <cstring>
#include <functional>

#include "kernels/cpu/half_float.h"
#include "kiln/launch_env.h"

namespace kiln {
namespace {

enum class Op : uint8_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast };

// What every rank must agree on, sent ahead of its operand.
struct Header {
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t reduce = 0;  // ReduceOp
  uint8_t pad = 0;
  int32_t root = 0;
  int64_t count = 0;
};

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

}  // namespace

struct SocketCollective::Call {
  Header header;
  // Rank 0: every rank's operand (rank order, headers stripped) → each rank's result.
  std::function<std::vector<std::string>(const std::vector<std::string>&)> combine;
};

Result<std::unique_ptr<SocketCollective>> SocketCollective::connect(const RendezvousSpec& spec) {
  KILN_ASSIGN_OR_RETURN(auto channel, TcpBootstrap::connect(spec));
  return std::make_unique<SocketCollective>(std::move(channel));
}

Result<std::string> SocketCollective::meet(const Call& call, std::string operand) {
  const int world = world_size();
  // Replies start with one byte: 0 and the result, or 1 and the error every rank returns.
  if (rank() != 0) {
    KILN_RETURN_IF_ERROR(channel_->send(0, pack(call.header, operand.data(), operand.size())));
    KILN_ASSIGN_OR_RETURN(std::string reply, channel_->receive(0));
    if (reply.empty()) return data_loss("collective `socket`: an empty reply from rank 0");
    if (reply[0] != 0) return unavailable("collective `socket`: " + reply.substr(1));
    return reply.substr(1);
  }
  std::vector<std::string> operands(world);
  operands[0] = std::move(operand);
  std::string disagreement;
  for (int r = 1; r < world; ++r) {
    auto blob = channel_->receive(r);
    if (!blob.ok()) {
      // Release the ranks already heard from, so they fail instead of waiting for the timeout.
      const std::string why = "tensor-parallel rank " + std::to_string(r) + " failed: " + blob.status().message();
      for (int q = 1; q < world; ++q)
        if (q != r) (void)channel_->send(q, std::string(1, '\1') + why);
      return unavailable("collective `socket`: " + why);
    }
    Header h;
    if (blob->size() < sizeof h) return data_loss("collective `socket`: a short message from rank " + std::to_string(r));
    std::memcpy(&h, blob->data(), sizeof h);
    if (disagreement.empty() && std::memcmp(&h, &call.header, sizeof h) != 0)
      disagreement = "ranks disagree on the call (rank 0: " + describe(call.header) + "; rank " + std::to_string(r) +
                     ": " + describe(h) + ")";
    operands[r] = blob->substr(sizeof h);
  }
  if (!disagreement.empty()) {
    for (int r = 1; r < world; ++r) (void)channel_->send(r, std::string(1, '\1') + disagreement);
    return internal_error("collective `socket`: " + disagreement);
  }
  std::vector<std::string> results = call.combine(operands);
  for (int r = 1; r < world; ++r) KILN_RETURN_IF_ERROR(channel_->send(r, std::string(1, '\0') + results[r]));
  return std::move(results[0]);
}

Status SocketCollective::all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) {
  KILN_RETURN_IF_ERROR(need_host(stream, "all_reduce"));
  KILN_RETURN_IF_ERROR(need_reducible(dtype, "all_reduce"));
  if (count < 0) return invalid_argument("collective `socket`: negative element count");
  if (world_size() == 1) return ok_status();
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  Call call{{static_cast<uint8_t>(Op::kAllReduce), static_cast<uint8_t>(dtype), static_cast<uint8_t>(op), 0, 0, count},
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
  Call call{{static_cast<uint8_t>(Op::kAllGather), static_cast<uint8_t>(dtype), 0, 0, 0, count},
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
  Call call{{static_cast<uint8_t>(Op::kReduceScatter), static_cast<uint8_t>(dtype), static_cast<uint8_t>(op), 0, 0, count},
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
  Call call{{static_cast<uint8_t>(Op::kBroadcast), static_cast<uint8_t>(dtype), 0, 0, root, count},
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
  KILN_ASSIGN_OR_RETURN(auto collective, SocketCollective::connect(rendezvous_spec(launch)));
  return std::unique_ptr<Collective>(std::move(collective));
}

}  // namespace kiln
