#include "exl3_cuda_objects.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "exl3_kernels.h"

namespace kiln::exl3::cuda {
namespace {

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

Status launched(const std::string& what, const char* error) {
  if (!error) return ok_status();
  return internal_error(what + ": " + error);
}

Status check_bf16_input(const TensorView& t, int64_t width, const std::string& name) {
  if (!t.device.is_cuda() || t.dtype != DType::kBF16 || !t.is_contiguous() || t.rank < 1 || t.dim(-1) != width)
    return invalid_argument("`" + name + "`: input must be contiguous BF16 [..., " + std::to_string(width) +
                            "] on a CUDA device, got " + dtype_name(t.dtype) + " " + t.shape_string() + " on " +
                            t.device.to_string());
  return ok_status();
}

class CudaLinear final : public Linear {
 public:
  CudaLinear(DeviceContext& dev, std::vector<DevicePart> parts, int64_t in, std::shared_ptr<SharedScratch> scratch)
      : dev_(dev), parts_(std::move(parts)), in_(in), k_pad_((in + 127) / 128 * 128), scratch_(std::move(scratch)) {
    for (DevicePart& p : parts_) {
      out_ += p.out;
      if (p.quantized) {
        splits_.push_back(gemv_splits(p.quantized->k_pad, p.quantized->n_pad, dev_.multiprocessor_count()));
        max_partial_ = std::max<int64_t>(max_partial_, splits_.back() * p.quantized->n_pad);
      } else {
        splits_.push_back(0);
      }
    }
  }

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  Device device() const override { return dev_.device(); }
  size_t bytes() const override {
    size_t b = 0;
    for (const DevicePart& p : parts_) b += p.quantized ? p.quantized->bytes() : static_cast<size_t>(p.out * in_) * 2;
    return b;
  }
  // Every row runs the same arithmetic whatever the row count: the split count depends on the shape only, and rows
  // never share a sum (see exl3_kernels.h).
  int64_t batch_invariant_rows() const override { return INT64_MAX; }
  size_t workspace_bytes(int64_t max_rows, Epilogue) const override {
    return align256(static_cast<size_t>(max_rows * k_pad_) * 4) + align256(static_cast<size_t>(max_rows * max_partial_) * 4);
  }

  Status run(const LinearRun& a, Stream stream) const override {
    const std::string& name = parts_[0].name;
    if (a.epilogue != Epilogue::kNone) return unimplemented("`" + name + "`: the CUDA `exl3` format fuses no epilogue");
    KILN_RETURN_IF_ERROR(check_bf16_input(a.x, in_, name));
    if (!a.y.device.is_cuda() || (a.y.dtype != DType::kBF16 && a.y.dtype != DType::kF32) || !a.y.is_contiguous() ||
        a.y.dim(-1) != out_)
      return invalid_argument("`" + name + "`: output must be contiguous BF16 or F32 [..., " + std::to_string(out_) +
                              "] on a CUDA device, got " + dtype_name(a.y.dtype) + " " + a.y.shape_string());
    const int64_t n = a.x.numel() / in_;
    if (a.y.numel() / out_ != n)
      return invalid_argument("`" + name + "`: input " + a.x.shape_string() + " and output " + a.y.shape_string() +
                              " have different numbers of rows");
    if (n == 0) return ok_status();
    if (max_partial_ == 0 || (a.workspace && a.workspace_bytes >= workspace_bytes(n, a.epilogue)))
      return run_rows(a, 0, n, a.workspace, stream);
    // No (or too little) workspace from the caller: passes of kScratchRows rows through the shared scratch.
    if (!scratch_ || scratch_->bytes() < workspace_bytes(kScratchRows, a.epilogue))
      return internal_error("`" + name + "`: the format's shared scratch was not reserved");
    for (int64_t r = 0; r < n; r += kScratchRows)
      KILN_RETURN_IF_ERROR(run_rows(a, r, std::min(kScratchRows, n - r), scratch_->data(), stream));
    return ok_status();
  }

  Status run_rows(const LinearRun& a, int64_t row0, int64_t n, void* workspace, Stream stream) const {
    auto* xr = static_cast<float*>(workspace);
    auto* partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(static_cast<size_t>(n * k_pad_) * 4));
    const bool y_bf16 = a.y.dtype == DType::kBF16;
    const uint16_t* x = a.x.as<uint16_t>() + row0 * in_;
    void* y = static_cast<char*>(a.y.data) + row0 * out_ * (y_bf16 ? 2 : 4);
    int64_t col = 0;
    for (size_t pi = 0; pi < parts_.size(); ++pi) {
      const DevicePart& p = parts_[pi];
      if (!p.quantized) {
        KILN_RETURN_IF_ERROR(launched("`" + p.name + "` dense product",
                                      dense_gemv(x, n, in_, p.dense, p.out, p.dense_bias, y,
                                                 y_bf16, out_, col, a.accumulate, stream.handle)));
        col += p.out;
        continue;
      }
      const DeviceModule& m = *p.quantized;
      RotateInputArgs r;
      r.x_bf16 = x, r.x_stride = in_, r.rows = n, r.in = in_, r.k_pad = m.k_pad;
      r.suh.fixed = m.suh, r.hadamard_scale = hadamard_scale(), r.xr = xr;
      KILN_RETURN_IF_ERROR(launched("`" + p.name + "` input rotation", rotate_input(r, stream.handle)));
      GemvArgs g;
      g.trellis.fixed = m.trellis, g.bits = m.bits, g.codebook = m.codebook, g.xr = xr, g.rows = n;
      g.k_pad = m.k_pad, g.n_pad = m.n_pad, g.splits = splits_[pi], g.partial = partial;
      const int rows_per_block = n == 1 ? 1 : n <= 4 ? 4 : 8;
      KILN_RETURN_IF_ERROR(launched("`" + p.name + "` trellis product", trellis_gemv(g, rows_per_block, stream.handle)));
      FinishArgs f;
      f.partial = partial, f.splits = splits_[pi], f.rows = n, f.n_pad = m.n_pad, f.out = m.out;
      f.hadamard_scale = hadamard_scale(), f.svh.fixed = m.svh, f.bias = m.bias;
      f.y = y, f.y_bf16 = y_bf16, f.y_stride = out_, f.col_offset = col, f.accumulate = a.accumulate;
      KILN_RETURN_IF_ERROR(launched("`" + p.name + "` output rotation", finish_output(f, stream.handle)));
      col += p.out;
    }
    return ok_status();
  }

  Status dequantize(TensorView out, Stream stream) const override {
    if (!out.device.is_cuda() || out.numel() != out_ * in_ || !out.is_contiguous() ||
        (out.dtype != DType::kF32 && out.dtype != DType::kBF16))
      return invalid_argument("`" + parts_[0].name + "`: dequantize needs a contiguous F32 or BF16 [" +
                              std::to_string(out_) + ", " + std::to_string(in_) + "] buffer on the CUDA device");
    const bool bf16 = out.dtype == DType::kBF16;
    int64_t row = 0;
    for (const DevicePart& p : parts_) {
      if (p.quantized) {
        const DeviceModule& m = *p.quantized;
        KILN_RETURN_IF_ERROR(launched("`" + p.name + "` dequantize",
                                      cuda::dequantize(m.trellis, m.bits, m.codebook, m.k_pad, m.n_pad, m.in, m.out,
                                                       m.suh, m.svh, hadamard_scale(), out.data, bf16, row,
                                                       stream.handle)));
      } else {
        KILN_RETURN_IF_ERROR(launched("`" + p.name + "` dequantize",
                                      copy_dense_rows(p.dense, p.out * in_, out.data, bf16, row * in_, stream.handle)));
      }
      row += p.out;
    }
    return ok_status();
  }

 private:
  DeviceContext& dev_;
  std::vector<DevicePart> parts_;
  int64_t in_ = 0, out_ = 0, k_pad_ = 0;
  std::shared_ptr<SharedScratch> scratch_;
  std::vector<int> splits_;
  int64_t max_partial_ = 0;  // max over EXL3 parts of splits · n_pad
};

// One projection of every expert: device tables of the experts' trellis and scale pointers, indexed by expert id.
struct Projection {
  int bits = 0, codebook = 0, splits = 1;
  int64_t in = 0, out = 0, k_pad = 0, n_pad = 0;
  const uint32_t* const* trellis = nullptr;
  const float* const* suh = nullptr;
  const float* const* svh = nullptr;
};

class CudaExpertSet final : public ExpertSet {
 public:
  CudaExpertSet(DeviceContext& dev, std::string prefix, Projection gate, Projection up, Projection down, int64_t experts,
                int64_t hidden, int64_t inter, size_t bytes)
      : dev_(dev), prefix_(std::move(prefix)), gate_(gate), up_(up), down_(down), e_(experts), hidden_(hidden),
        inter_(inter), bytes_(bytes) {}

  int64_t num_experts() const override { return e_; }
  int64_t hidden_size() const override { return hidden_; }
  int64_t intermediate_size() const override { return inter_; }
  Device device() const override { return dev_.device(); }
  size_t bytes() const override { return bytes_; }
  // Each pair is its own row of every launch, with shape-only split counts: invariant for any token count.
  int64_t batch_invariant_rows() const override { return INT64_MAX; }
  size_t workspace_bytes(int64_t max_tokens, int top_k) const override {
    const int64_t pairs = max_tokens * top_k;
    const int64_t partial = std::max({gate_.splits * gate_.n_pad, up_.splits * up_.n_pad, down_.splits * down_.n_pad});
    return align256(static_cast<size_t>(pairs * std::max(gate_.k_pad, down_.k_pad)) * 4) +
           align256(static_cast<size_t>(pairs * partial) * 4) + 2 * align256(static_cast<size_t>(pairs * inter_) * 4);
  }

  Result<bool> run(const ExpertRun& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_bf16_input(a.x, hidden_, prefix_));
    const int64_t n = a.x.numel() / hidden_;
    const int top_k = a.routing.top_k;
    if (top_k <= 0 || !a.routing.ids || !a.routing.weights || !a.pair_out)
      return invalid_argument("`" + prefix_ + "`: the CUDA `exl3` expert set needs top_k > 0, routing ids and weights "
                              "and pair_out");
    const int64_t pairs = n * top_k;
    if (pairs == 0) return false;
    if (!a.workspace || a.workspace_bytes < workspace_bytes(n, top_k))
      return invalid_argument("`" + prefix_ + "`: workspace of " + std::to_string(a.workspace_bytes) + " bytes, needs " +
                              std::to_string(workspace_bytes(n, top_k)));
    char* ws = static_cast<char*>(a.workspace);
    auto* xr = reinterpret_cast<float*>(ws);
    ws += align256(static_cast<size_t>(pairs * std::max(gate_.k_pad, down_.k_pad)) * 4);
    auto* partial = reinterpret_cast<float*>(ws);
    const int64_t partial_width =
        std::max({gate_.splits * gate_.n_pad, up_.splits * up_.n_pad, down_.splits * down_.n_pad});
    ws += align256(static_cast<size_t>(pairs * partial_width) * 4);
    auto* gate_out = reinterpret_cast<float*>(ws);
    ws += align256(static_cast<size_t>(pairs * inter_) * 4);
    auto* up_out = reinterpret_cast<float*>(ws);

    // gate and up: every pair reads its token's row (pair / top_k) and its expert's module (ids[pair]).
    for (const auto& [proj, dst] : {std::pair{&gate_, gate_out}, std::pair{&up_, up_out}}) {
      RotateInputArgs r;
      r.x_bf16 = a.x.as<uint16_t>(), r.x_stride = hidden_, r.x_div = top_k, r.rows = pairs, r.in = hidden_;
      r.k_pad = proj->k_pad, r.suh = table(proj->suh, a.routing.ids), r.hadamard_scale = hadamard_scale(), r.xr = xr;
      KILN_RETURN_IF_ERROR(launched("`" + prefix_ + "` input rotation", rotate_input(r, stream.handle)));
      KILN_RETURN_IF_ERROR(product(*proj, xr, pairs, a.routing.ids, partial, stream));
      FinishArgs f;
      f.partial = partial, f.splits = proj->splits, f.rows = pairs, f.n_pad = proj->n_pad, f.out = inter_;
      f.hadamard_scale = hadamard_scale(), f.svh = table(proj->svh, a.routing.ids);
      f.y = dst, f.y_stride = inter_;
      KILN_RETURN_IF_ERROR(launched("`" + prefix_ + "` output rotation", finish_output(f, stream.handle)));
    }
    KILN_RETURN_IF_ERROR(launched("`" + prefix_ + "` SwiGLU",
                                  swiglu_rotate(gate_out, up_out, pairs, inter_, down_.k_pad, a.swiglu_limit,
                                                table(down_.suh, a.routing.ids), hadamard_scale(), xr, stream.handle)));
    KILN_RETURN_IF_ERROR(product(down_, xr, pairs, a.routing.ids, partial, stream));
    FinishArgs f;
    f.partial = partial, f.splits = down_.splits, f.rows = pairs, f.n_pad = down_.n_pad, f.out = hidden_;
    f.hadamard_scale = hadamard_scale(), f.svh = table(down_.svh, a.routing.ids), f.row_weight = a.routing.weights;
    f.y = a.pair_out, f.y_stride = hidden_;
    KILN_RETURN_IF_ERROR(launched("`" + prefix_ + "` down output", finish_output(f, stream.handle)));
    return false;  // the shared expert is the caller's
  }

 private:
  template <class T>
  static PerRow<T> table(const T* const* t, const int32_t* ids) {
    PerRow<T> p;
    p.table = t, p.ids = ids;
    return p;
  }

  Status product(const Projection& proj, const float* xr, int64_t pairs, const int32_t* ids, float* partial,
                 Stream stream) const {
    GemvArgs g;
    g.trellis = table(proj.trellis, ids), g.bits = proj.bits, g.codebook = proj.codebook, g.xr = xr, g.rows = pairs;
    g.k_pad = proj.k_pad, g.n_pad = proj.n_pad, g.splits = proj.splits, g.partial = partial;
    return launched("`" + prefix_ + "` trellis product", trellis_gemv(g, 1, stream.handle));
  }

  DeviceContext& dev_;
  std::string prefix_;
  Projection gate_, up_, down_;
  int64_t e_, hidden_, inter_;
  size_t bytes_;
};

}  // namespace

size_t DeviceModule::bytes() const {
  return static_cast<size_t>(k_pad / 16 * n_pad / 16 * 16 * bits) * 2 + static_cast<size_t>(k_pad + n_pad) * 4 +
         (bias ? static_cast<size_t>(out) * 4 : 0);
}

float hadamard_scale() { return 1.0f / std::sqrt(static_cast<float>(kHadamardSize)); }

Status SharedScratch::reserve(size_t bytes) {
  if (bytes <= bytes_) return ok_status();
  // Grown geometrically: the arena frees nothing before the model goes, so each step up strands the old buffer.
  const size_t grown = std::max(bytes, 2 * bytes_);
  KILN_ASSIGN_OR_RETURN(data_, dev_.allocate(grown, "exl3 shared scratch"));
  bytes_ = grown;
  return ok_status();
}

Result<std::unique_ptr<Linear>> make_cuda_linear(DeviceContext& dev, std::vector<DevicePart> parts, int64_t in,
                                                 std::shared_ptr<SharedScratch> scratch) {
  auto l = std::make_unique<CudaLinear>(dev, std::move(parts), in, scratch);
  KILN_RETURN_IF_ERROR(scratch->reserve(l->workspace_bytes(kScratchRows, Epilogue::kNone)));
  return std::unique_ptr<Linear>(std::move(l));
}

Result<std::unique_ptr<ExpertSet>> make_cuda_expert_set(DeviceContext& dev, const std::string& prefix,
                                                        DeviceExperts experts, int64_t hidden, int64_t inter) {
  const int64_t count = static_cast<int64_t>(experts.gate.size());
  Projection proj[3];
  const std::vector<DeviceModule>* lists[3] = {&experts.gate, &experts.up, &experts.down};
  const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  size_t bytes = 0;
  for (int k = 0; k < 3; ++k) {
    const std::vector<DeviceModule>& list = *lists[k];
    const DeviceModule& first = list.at(0);
    for (int64_t e = 0; e < count; ++e) {
      const DeviceModule& m = list[e];
      if (m.bits != first.bits || m.codebook != first.codebook)
        return unimplemented("`" + prefix + "." + std::to_string(e) + "." + names[k] + "` has K = " +
                             std::to_string(m.bits) + " (codebook " + std::to_string(m.codebook) + ") but expert 0's " +
                             names[k] + " has K = " + std::to_string(first.bits) + " (codebook " +
                             std::to_string(first.codebook) + "): the CUDA expert kernels need one K and codebook per "
                             "projection across a layer's experts");
      if (m.bias)
        return unimplemented("`" + prefix + "." + std::to_string(e) + "." + names[k] +
                             ".bias`: the CUDA `exl3` expert kernels take no bias");
      bytes += m.bytes();
    }
    std::vector<const void*> host(static_cast<size_t>(3 * count));
    for (int64_t e = 0; e < count; ++e) {
      host[e] = list[e].trellis;
      host[count + e] = list[e].suh;
      host[2 * count + e] = list[e].svh;
    }
    KILN_ASSIGN_OR_RETURN(void* mem, dev.allocate(host.size() * sizeof(void*), (prefix + " tables").c_str()));
    KILN_RETURN_IF_ERROR(dev.copy(mem, host.data(), host.size() * sizeof(void*), true));
    auto* tables = static_cast<const void* const*>(mem);
    Projection& p = proj[k];
    p.bits = first.bits, p.codebook = first.codebook, p.in = first.in, p.out = first.out;
    p.k_pad = first.k_pad, p.n_pad = first.n_pad;
    p.splits = gemv_splits(p.k_pad, p.n_pad, dev.multiprocessor_count());
    p.trellis = reinterpret_cast<const uint32_t* const*>(tables);
    p.suh = reinterpret_cast<const float* const*>(tables + count);
    p.svh = reinterpret_cast<const float* const*>(tables + 2 * count);
  }
  return std::unique_ptr<ExpertSet>(
      new CudaExpertSet(dev, prefix, proj[0], proj[1], proj[2], count, hidden, inter, bytes));
}

}  // namespace kiln::exl3::cuda
