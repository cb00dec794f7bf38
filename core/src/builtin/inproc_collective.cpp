#include "builtin/inproc_collective.h"

#include <cstring>

namespace kiln::builtin {
namespace {

enum OpCode { kAllReduceSum = 1, kAllReduceMax, kAllGather, kReduceScatterSum, kReduceScatterMax, kBroadcast };

Status need_host(Stream stream, const char* call) {
  if (!stream.device.is_cpu())
    return failed_precondition(std::string("collective `local` with ranks in one process: ") + call +
                               " on " + stream.device.to_string() + " (its ranks are CPU threads; host memory only)");
  return ok_status();
}

Status need_f32(DType dtype, const char* call) {
  if (dtype != DType::kF32)
    return invalid_argument(std::string("collective `local` with ranks in one process: ") + call +
                            " reduces fp32 only, got " + dtype_name(dtype));
  return ok_status();
}

// out[i] = in_0[i] ∘ in_1[i] ∘ … in rank order, for i in [begin, begin + n).
void reduce_in_rank_order(const std::vector<const float*>& in, int64_t begin, int64_t n, bool max, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = in[0][begin + i];
    for (size_t r = 1; r < in.size(); ++r) {
      const float v = in[r][begin + i];
      acc = max ? (v > acc ? v : acc) : acc + v;
    }
    out[i] = acc;
  }
}

class InprocEndpoint final : public Collective {
 public:
  InprocEndpoint(InprocGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_.world(); }
  Status all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_RETURN_IF_ERROR(need_host(stream, "all_reduce"));
    return group_.all_reduce(rank_, buffer, count, dtype, op);
  }
  Status all_gather(const void* in, void* out, int64_t count, DType dtype, Stream stream) override {
    KILN_RETURN_IF_ERROR(need_host(stream, "all_gather"));
    return group_.all_gather(rank_, in, out, count, dtype);
  }
  Status reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, Stream stream) override {
    KILN_RETURN_IF_ERROR(need_host(stream, "reduce_scatter"));
    return group_.reduce_scatter(rank_, in, out, count, dtype, op);
  }
  Status broadcast(void* buffer, int64_t count, DType dtype, int root, Stream stream) override {
    KILN_RETURN_IF_ERROR(need_host(stream, "broadcast"));
    return group_.broadcast(rank_, buffer, count, dtype, root);
  }

 private:
  InprocGroup& group_;
  const int rank_;
};

}  // namespace

InprocGroup::InprocGroup(int world) : world_(world < 1 ? 1 : world), posts_(world_) {}

std::unique_ptr<Collective> InprocGroup::endpoint(int rank) {
  return std::unique_ptr<Collective>(new InprocEndpoint(*this, rank));
}

void InprocGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) why_ = why;
  aborted_ = true;
  cv_.notify_all();
}

void InprocGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  why_.clear();
  arrived_ = 0;
}

Status InprocGroup::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return unavailable("tensor-parallel group aborted: " + why_);
  const uint64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return ok_status();
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) return unavailable("tensor-parallel group aborted: " + why_);
  return ok_status();
}

Status InprocGroup::post_and_wait(int rank, const void* in, void* out, int64_t count, DType dtype, int op_code) {
  if (rank < 0 || rank >= world_) return out_of_range("rank " + std::to_string(rank) + " is not in the group");
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts_[rank] = Post{in, out, count, dtype, op_code};
  }
  return wait_all();
}

Status InprocGroup::check_posts(const char* call) const {
  // Read after the first barrier and before the second: no rank writes posts_ in between.
  const Post& p0 = posts_[0];
  for (int r = 1; r < world_; ++r) {
    const Post& p = posts_[r];
    if (p.op != p0.op || p.count != p0.count || p.dtype != p0.dtype)
      return internal_error(std::string("collective `local`: ranks disagree on ") + call + " (rank 0: " +
                            std::to_string(p0.count) + " elements, operation " + std::to_string(p0.op) + "; rank " +
                            std::to_string(r) + ": " + std::to_string(p.count) + ", operation " + std::to_string(p.op) +
                            ")");
  }
  if (p0.count < 0) return invalid_argument("collective `local`: negative element count " + std::to_string(p0.count));
  return ok_status();
}

Status InprocGroup::all_reduce(int rank, void* buffer, int64_t count, DType dtype, ReduceOp op) {
  KILN_RETURN_IF_ERROR(need_f32(dtype, "all_reduce"));
  KILN_RETURN_IF_ERROR(post_and_wait(rank, buffer, buffer, count, dtype, op == ReduceOp::kMax ? kAllReduceMax : kAllReduceSum));
  Status checked = check_posts("all_reduce");
  std::vector<float> result;
  if (checked.ok() && world_ > 1) {
    std::vector<const float*> in(world_);
    for (int r = 0; r < world_; ++r) in[r] = static_cast<const float*>(posts_[r].in);
    result.resize(static_cast<size_t>(count));
    reduce_in_rank_order(in, 0, count, op == ReduceOp::kMax, result.data());
  }
  KILN_RETURN_IF_ERROR(wait_all());  // every rank has read every buffer before any is overwritten
  KILN_RETURN_IF_ERROR(checked);
  if (!result.empty()) std::memcpy(buffer, result.data(), result.size() * sizeof(float));
  return ok_status();
}

Status InprocGroup::all_gather(int rank, const void* in, void* out, int64_t count, DType dtype) {
  KILN_RETURN_IF_ERROR(post_and_wait(rank, in, out, count, dtype, kAllGather));
  Status checked = check_posts("all_gather");
  if (checked.ok()) {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    for (int r = 0; r < world_; ++r)
      if (bytes > 0) std::memmove(static_cast<char*>(out) + r * bytes, posts_[r].in, bytes);
  }
  KILN_RETURN_IF_ERROR(wait_all());  // no rank reuses its input before every rank has copied it
  return checked;
}

Status InprocGroup::reduce_scatter(int rank, const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  KILN_RETURN_IF_ERROR(need_f32(dtype, "reduce_scatter"));
  KILN_RETURN_IF_ERROR(post_and_wait(rank, in, out, count, dtype,
                                     op == ReduceOp::kMax ? kReduceScatterMax : kReduceScatterSum));
  Status checked = check_posts("reduce_scatter");
  std::vector<float> result;
  if (checked.ok()) {
    std::vector<const float*> ins(world_);
    for (int r = 0; r < world_; ++r) ins[r] = static_cast<const float*>(posts_[r].in);
    result.resize(static_cast<size_t>(count));
    reduce_in_rank_order(ins, static_cast<int64_t>(rank) * count, count, op == ReduceOp::kMax, result.data());
  }
  KILN_RETURN_IF_ERROR(wait_all());
  KILN_RETURN_IF_ERROR(checked);
  if (!result.empty()) std::memcpy(out, result.data(), result.size() * sizeof(float));
  return ok_status();
}

Status InprocGroup::broadcast(int rank, void* buffer, int64_t count, DType dtype, int root) {
  if (root < 0 || root >= world_)
    return out_of_range("collective `local`: broadcast root " + std::to_string(root) + " is not one of the " +
                        std::to_string(world_) + " ranks");
  KILN_RETURN_IF_ERROR(post_and_wait(rank, buffer, buffer, count, dtype, kBroadcast));
  Status checked = check_posts("broadcast");
  if (checked.ok() && rank != root && count > 0)
    std::memcpy(buffer, posts_[root].in, static_cast<size_t>(count) * dtype_size(dtype));
  KILN_RETURN_IF_ERROR(wait_all());
  return checked;
}

}  // namespace kiln::builtin
