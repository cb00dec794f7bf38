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

int rows_per_block(int64_t rows) { return rows == 1 ? 1 : rows <= 4 ? 4 : 8; }

class CudaLinear final : public Linear {
 public:
  CudaLinear(DeviceContext& dev, std::vector<DevicePart> parts, int64_t in)
      : dev_(dev), parts_(std::move(parts)), in_(in) {
    for (DevicePart& p : parts_) out_ += p.out;
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
    const bool y_bf16 = a.y.dtype == DType::kBF16;
    // Consecutive EXL3 parts of one K and codebook go in one launch (their blocks side by side: a fused q_a + kv_a
    // or gate + up is one kernel, not two); dense parts have their own GEMV.
    int64_t col = 0;
    for (size_t pi = 0; pi < parts_.size();) {
      const DevicePart& first = parts_[pi];
      if (!first.quantized) {
        KILN_RETURN_IF_ERROR(launched("`" + first.name + "` dense product",
                                      dense_gemv(a.x.as<uint16_t>(), n, in_, first.dense, first.out, first.dense_bias,
                                                 a.y.data, y_bf16, out_, col, a.accumulate, stream.handle)));
        col += first.out;
        ++pi;
        continue;
      }
      const DeviceModule& m0 = *first.quantized;
      ProductArgs g;
      g.x_bf16 = a.x.as<uint16_t>(), g.x_stride = in_, g.in = in_;
      g.bits = m0.bits, g.codebook = m0.codebook, g.k_pad = m0.k_pad;
      g.splits = product_splits(m0.k_pad), g.hadamard_scale = hadamard_scale();
      g.y_bf16 = y_bf16, g.accumulate = a.accumulate;
      g.parts = 0;
      for (; pi < parts_.size() && g.parts < kMaxParts; ++pi) {
        const DevicePart& p = parts_[pi];
        if (!p.quantized || p.quantized->bits != m0.bits || p.quantized->codebook != m0.codebook) break;
        const DeviceModule& m = *p.quantized;
        ProductPart& part = g.part[g.parts++];
        part.trellis.fixed = m.trellis, part.suh.fixed = m.suh, part.svh.fixed = m.svh, part.bias = m.bias;
        part.n_pad = m.n_pad, part.out = m.out;
        part.y = a.y.data, part.y_stride = out_, part.col_offset = col;
        col += p.out;
      }
      for (int64_t r = 0; r < n; r += kMaxPassRows) {
        g.row_begin = r, g.rows = std::min(kMaxPassRows, n - r);
        KILN_RETURN_IF_ERROR(launched("`" + first.name + "` trellis product",
                                      trellis_product(g, rows_per_block(g.rows), stream.handle)));
      }
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
  int64_t in_ = 0, out_ = 0;
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
    return 2 * align256(static_cast<size_t>(pairs * inter_) * 4);
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
    auto* gate_out = reinterpret_cast<float*>(ws);
    ws += align256(static_cast<size_t>(pairs * inter_) * 4);
    auto* up_out = reinterpret_cast<float*>(ws);

    // gate and up: every pair reads its token's row (pair / top_k) and its expert's module (ids[pair]); down reads
    // the pair's SwiGLU and scales by its routing weight.
    const ProductArgs common = [&] {
      ProductArgs g;
      g.hadamard_scale = hadamard_scale();
      return g;
    }();
    // gate and up share the input: one launch when they share K and codebook.
    ProductArgs gu = with(common, gate_, a.routing.ids, gate_out, inter_);
    gu.x_bf16 = a.x.as<uint16_t>(), gu.x_stride = hidden_, gu.x_div = top_k, gu.in = hidden_;
    if (up_.bits == gate_.bits && up_.codebook == gate_.codebook) {
      gu.part[gu.parts++] = with(common, up_, a.routing.ids, up_out, inter_).part[0];
      KILN_RETURN_IF_ERROR(passes(gu, pairs, stream));
    } else {
      KILN_RETURN_IF_ERROR(passes(gu, pairs, stream));
      ProductArgs u = with(common, up_, a.routing.ids, up_out, inter_);
      u.x_bf16 = gu.x_bf16, u.x_stride = hidden_, u.x_div = top_k, u.in = hidden_;
      u.routing_before_wait = true;  // the gate launch just before read the routing after its own wait
      KILN_RETURN_IF_ERROR(passes(u, pairs, stream));
    }
    ProductArgs d = with(common, down_, a.routing.ids, a.pair_out, hidden_);
    d.gate = gate_out, d.up = up_out, d.swiglu_limit = a.swiglu_limit, d.in = inter_;
    d.row_weight = a.routing.weights;
    d.routing_before_wait = true;  // the gate/up launch just before read the routing after its own wait
    KILN_RETURN_IF_ERROR(passes(d, pairs, stream));
    return false;  // the shared expert is the caller's (run after these launches, its bf16 weight reads overlap them)
  }

 private:
  // One projection as the launch's only part, writing [pairs, y_stride] fp32 at y.
  static ProductArgs with(ProductArgs g, const Projection& p, const int32_t* ids, void* y, int64_t y_stride) {
    ProductPart& part = g.part[0];
    part.suh.table = p.suh, part.suh.ids = ids;
    part.trellis.table = p.trellis, part.trellis.ids = ids;
    part.svh.table = p.svh, part.svh.ids = ids;
    part.n_pad = p.n_pad, part.out = p.out, part.y = y, part.y_stride = y_stride;
    g.bits = p.bits, g.codebook = p.codebook, g.k_pad = p.k_pad, g.splits = p.splits, g.parts = 1;
    return g;
  }

  Status passes(ProductArgs g, int64_t pairs, Stream stream) const {
    for (int64_t r = 0; r < pairs; r += kMaxPassRows) {
      g.row_begin = r, g.rows = std::min(kMaxPassRows, pairs - r);
      KILN_RETURN_IF_ERROR(launched("`" + prefix_ + "` trellis product", trellis_product(g, 1, stream.handle)));
    }
    return ok_status();
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

Result<std::unique_ptr<Linear>> make_cuda_linear(DeviceContext& dev, std::vector<DevicePart> parts, int64_t in) {
  return std::unique_ptr<Linear>(std::make_unique<CudaLinear>(dev, std::move(parts), in));
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
    p.splits = expert_splits(p.k_pad);
    p.trellis = reinterpret_cast<const uint32_t* const*>(tables);
    p.suh = reinterpret_cast<const float* const*>(tables + count);
    p.svh = reinterpret_cast<const float* const*>(tables + 2 * count);
  }
  return std::unique_ptr<ExpertSet>(
      new CudaExpertSet(dev, prefix, proj[0], proj[1], proj[2], count, hidden, inter, bytes));
}

}  // namespace kiln::exl3::cuda
