// The `dense` weight format on CUDA: bf16 copies in device memory (stacked modules in one buffer, experts as
// [E, 2·I, hidden] and [E, hidden, I]), bf16 activations. Few rows run the weight-streaming skinny GEMM and the
// per-expert GEMVs (batch invariant up to kSkinnyGemmMaxRows rows), more rows cuBLAS and the grouped expert GEMM.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "builtin/dense_weight_format.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/host_experts_bf16.h"
#include "runtime/cuda/cuda_device_context.h"
#include "runtime/cuda/model_glue_kernels.h"
#include "runtime/cuda/weight_upload.h"

namespace kiln::builtin {
namespace {

using cuda::CudaDeviceContext;

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

Status check_bf16(const char* what, const TensorView& t, int64_t width, const std::string& layer) {
  if (!t.device.is_cuda() || t.dtype != DType::kBF16 || !t.is_contiguous() || t.rank < 1 || t.dim(-1) != width)
    return invalid_argument("`" + layer + "`: " + what + " must be contiguous BF16 [..., " + std::to_string(width) +
                            "] on a CUDA device, got " + dtype_name(t.dtype) + " " + t.shape_string() + " on " +
                            t.device.to_string());
  return ok_status();
}

class DenseCudaLinear final : public Linear {
 public:
  DenseCudaLinear(std::string name, CudaDeviceContext& dev, const uint16_t* w, int64_t in, int64_t out)
      : name_(std::move(name)), dev_(dev), w_(w), in_(in), out_(out) {}

  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  Device device() const override { return dev_.device(); }
  size_t bytes() const override { return static_cast<size_t>(in_ * out_) * 2; }
  bool supports(Epilogue e) const override { return e == Epilogue::kNone || (e == Epilogue::kSwiGLU && out_ % 2 == 0); }
  // Past the skinny bound SwiGLU runs cuBLAS into a [rows, out] bf16 buffer first.
  size_t workspace_bytes(int64_t max_rows, Epilogue e) const override {
    return e == Epilogue::kSwiGLU && max_rows > cuda::kSkinnyGemmMaxRows ? align256(max_rows * out_ * 2) : 0;
  }
  int64_t batch_invariant_rows() const override {
    // The skinny GEMM reads rows in 16-byte vectors; other widths run cuBLAS, whose kernel follows the row count.
    if (in_ % 8 != 0) return 1;
    return out_ <= cuda::kSkinnyGemmWideOut ? cuda::kSkinnyGemmMaxRows : cuda::kSkinnyGemmMaxRowsWideOut;
  }

  Status run(const LinearRun& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_bf16("input", a.x, in_, name_));
    const int64_t n = a.x.numel() / in_;
    const cudaStream_t st = cuda::cuda_stream_of(stream);
    if (a.epilogue == Epilogue::kSwiGLU) {
      if (a.accumulate) return invalid_argument("`" + name_ + "`: accumulate with an epilogue");
      const int64_t inter = out_ / 2;
      KILN_RETURN_IF_ERROR(check_bf16("output", a.y, inter, name_));
      auto* act = a.y.as<uint16_t>();
      if (n <= cuda::kSkinnyGemmMaxRows && cuda::skinny_gemm_supported(a.x.as<uint16_t>(), n, in_, w_))
        return cuda::skinny_gemm_swiglu_bf16(a.x.as<uint16_t>(), n, in_, w_, inter, act, st, a.swiglu_limit);
      if (a.workspace_bytes < static_cast<size_t>(n * out_ * 2))
        return invalid_argument("`" + name_ + "`: SwiGLU over " + std::to_string(n) + " rows needs " +
                                std::to_string(n * out_ * 2) + " bytes of workspace");
      auto* gu = static_cast<uint16_t*>(a.workspace);
      KILN_RETURN_IF_ERROR(dev_.gemm().linear(a.x.as<uint16_t>(), n, in_, w_, out_, gu, DType::kBF16, st));
      return cuda::swiglu_bf16(gu, gu + inter, n, inter, out_, act, st, a.swiglu_limit);
    }
    if (!a.y.device.is_cuda() || (a.y.dtype != DType::kBF16 && a.y.dtype != DType::kF32) || a.y.dim(-1) != out_)
      return invalid_argument("`" + name_ + "`: output must be BF16 or F32 [..., " + std::to_string(out_) +
                              "] on a CUDA device, got " + dtype_name(a.y.dtype) + " " + a.y.shape_string());
    return dev_.gemm().linear(a.x.as<uint16_t>(), n, in_, w_, out_, a.y.data, a.y.dtype, st, a.accumulate);
  }

  Status dequantize(TensorView out, Stream stream) const override {
    if (out.numel() != in_ * out_ || !out.is_contiguous())
      return invalid_argument("`" + name_ + "`: dequantize needs a contiguous [" + std::to_string(out_) + ", " +
                              std::to_string(in_) + "] buffer");
    const cudaStream_t st = cuda::cuda_stream_of(stream);
    const size_t n = static_cast<size_t>(in_ * out_);
    if (out.dtype == DType::kBF16) {
      const cudaError_t e = cudaMemcpyAsync(out.data, w_, n * 2, cudaMemcpyDefault, st);
      return e == cudaSuccess ? ok_status() : internal_error("`" + name_ + "` dequantize: " + cudaGetErrorString(e));
    }
    if (out.dtype == DType::kF32 && out.device.is_cuda()) return cuda::bf16_to_f32(w_, n, out.as<float>(), st);
    return invalid_argument("`" + name_ + "`: dequantize writes BF16 (host or device) or F32 on the device");
  }

  TensorView dense_weight() const override {
    return TensorView::contiguous(const_cast<uint16_t*>(w_), DType::kBF16, {out_, in_}, dev_.device());
  }

 private:
  std::string name_;
  CudaDeviceContext& dev_;
  const uint16_t* w_;
  int64_t in_, out_;
};

class DenseCudaExpertSet final : public ExpertSet {
 public:
  DenseCudaExpertSet(std::string prefix, CudaDeviceContext& dev, const uint16_t* gate_up, const uint16_t* down,
                     int64_t experts, int64_t hidden, int64_t inter)
      : prefix_(std::move(prefix)), dev_(dev), gate_up_(gate_up), down_(down), e_(experts), hidden_(hidden), inter_(inter) {}

  int64_t num_experts() const override { return e_; }
  int64_t hidden_size() const override { return hidden_; }
  int64_t intermediate_size() const override { return inter_; }
  Device device() const override { return dev_.device(); }
  size_t bytes() const override { return static_cast<size_t>(e_ * 3 * inter_ * hidden_) * 2; }
  int64_t batch_invariant_rows() const override { return cuda::kSkinnyGemmMaxRows; }
  // The SwiGLU outputs of the pairs, and of a folded shared expert's rows.
  size_t workspace_bytes(int64_t max_tokens, int top_k) const override {
    return align256(static_cast<size_t>(max_tokens * top_k * inter_) * 2) +
           align256(static_cast<size_t>(max_tokens * inter_) * 2);
  }

  Result<bool> run(const ExpertRun& a, Stream stream) const override {
    KILN_RETURN_IF_ERROR(check_bf16("input", a.x, hidden_, prefix_));
    const int64_t n = a.x.numel() / hidden_, topk = a.routing.top_k;
    if (topk <= 0 || !a.routing.ids || !a.routing.weights || !a.routing.offsets || !a.routing.active ||
        !a.routing.order || !a.pair_out)
      return invalid_argument("`" + prefix_ + "`: the CUDA expert set needs top_k > 0, the routing (ids, weights and "
                              "the grouping by expert) and pair_out");
    if (a.workspace_bytes < workspace_bytes(n, static_cast<int>(topk)))
      return invalid_argument("`" + prefix_ + "`: workspace of " + std::to_string(a.workspace_bytes) + " bytes, needs " +
                              std::to_string(workspace_bytes(n, static_cast<int>(topk))));
    const cudaStream_t st = cuda::cuda_stream_of(stream);
    auto* moe_h = static_cast<uint16_t*>(a.workspace);
    auto* shared_h = reinterpret_cast<uint16_t*>(static_cast<char*>(a.workspace) +
                                                 align256(static_cast<size_t>(n * topk * inter_) * 2));
    const cuda::MoeDispatch d{const_cast<int32_t*>(a.routing.offsets), const_cast<int32_t*>(a.routing.active),
                              const_cast<int32_t*>(a.routing.order)};
    const uint16_t* x = a.x.as<uint16_t>();
    if (n > cuda::kSkinnyGemmMaxRows && cuda::moe_prefers_grouped_gemm(n * topk, e_)) {
      // Prompt-sized steps: tens of rows per expert, so tensor-core tiles beat streaming each weight row. Not in
      // batch-invariant steps (a pair's sums would depend on how many pairs its expert gets).
      KILN_RETURN_IF_ERROR(cuda::moe_gate_up_swiglu_grouped_bf16(x, n, topk, hidden_, inter_, gate_up_, e_, d,
                                                                 a.swiglu_limit, moe_h, st));
      KILN_RETURN_IF_ERROR(cuda::moe_down_grouped_bf16(moe_h, n * topk, inter_, hidden_, down_, e_, d, a.routing.weights,
                                                       a.pair_out, st));
      return false;
    }
    // A shared expert of the routed experts' shape in a batch-invariant step rides in the same launches (the CPU
    // models' bf16 precision follows: model/host_experts_bf16.h).
    static_assert(kGpuFoldedSharedExpertRows == cuda::kSkinnyGemmMaxRows, "the CPU mirrors when the GPU folds");
    cuda::MoeSharedExpert folded;
    const cuda::MoeSharedExpert* shared = nullptr;
    if (a.shared_gate_up && a.shared_down && a.shared_out && n <= cuda::kSkinnyGemmMaxRows) {
      const TensorView gu = a.shared_gate_up->dense_weight(), dn = a.shared_down->dense_weight();
      if (gu.data && dn.data && gu.dtype == DType::kBF16 && dn.dtype == DType::kBF16 && gu.shape[0] == 2 * inter_ &&
          gu.shape[1] == hidden_ && dn.shape[0] == hidden_ && dn.shape[1] == inter_) {
        folded = {gu.as<uint16_t>(), dn.as<uint16_t>(), n, shared_h, a.shared_out};
        shared = &folded;
      }
    }
    KILN_RETURN_IF_ERROR(cuda::moe_gate_up_swiglu_bf16(x, n, topk, hidden_, inter_, gate_up_, e_, d, a.swiglu_limit,
                                                       moe_h, st, shared));
    KILN_RETURN_IF_ERROR(cuda::moe_down_bf16(moe_h, n * topk, inter_, hidden_, down_, e_, d, a.routing.weights,
                                             a.pair_out, st, shared));
    return shared != nullptr;
  }

 private:
  std::string prefix_;
  CudaDeviceContext& dev_;
  const uint16_t *gate_up_, *down_;
  int64_t e_, hidden_, inter_;
};

class DenseCudaWeightFormat final : public WeightFormat {
 public:
  explicit DenseCudaWeightFormat(CudaDeviceContext& dev) : dev_(dev) {}

  Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const LinearSpec& spec) override {
    KILN_RETURN_IF_ERROR(check_linear_spec(spec));
    const int64_t in = spec.in_features, out = spec.total_out();
    KILN_ASSIGN_OR_RETURN(void* mem, dev_.allocate(static_cast<size_t>(in * out) * 2, spec.names[0].c_str()));
    auto* w = static_cast<uint16_t*>(mem);
    cuda::WeightUploader up(source, dev_.cuda_stream());
    int64_t row = 0;
    for (size_t i = 0; i < spec.names.size(); ++i) {
      const std::string& name = spec.names[i];
      if (!source.synthetic() && source.has(name + ".bias"))
        return unimplemented("`" + name + ".bias`: the `dense` weight format has no bias support (GLM linears have none)");
      KILN_RETURN_IF_ERROR(up.bf16(name + ".weight", spec.out_features[i], in, w + row * in));
      row += spec.out_features[i];
    }
    KILN_RETURN_IF_ERROR(up.finish());
    return std::unique_ptr<Linear>(new DenseCudaLinear(spec.names[0], dev_, w, in, out));
  }

  Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const ExpertSpec& spec) override {
    const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
    if (E <= 0 || H <= 0 || I <= 0)
      return invalid_argument("`" + spec.prefix + "`: experts, hidden and intermediate sizes must be positive");
    if (H % 8 != 0 || I % 8 != 0)
      return unimplemented("`" + spec.prefix + "`: the CUDA expert kernels need hidden and intermediate sizes that are "
                           "multiples of 8 (got " + std::to_string(H) + ", " + std::to_string(I) + ")");
    KILN_ASSIGN_OR_RETURN(void* gu_mem, dev_.allocate(static_cast<size_t>(E * 2 * I * H) * 2, spec.prefix.c_str()));
    KILN_ASSIGN_OR_RETURN(void* dn_mem, dev_.allocate(static_cast<size_t>(E * H * I) * 2, spec.prefix.c_str()));
    auto* gu = static_cast<uint16_t*>(gu_mem);
    auto* dn = static_cast<uint16_t*>(dn_mem);
    cuda::WeightUploader up(source, dev_.cuda_stream());
    for (int64_t e = 0; e < E; ++e) {
      const std::string b = spec.prefix + "." + std::to_string(e);
      KILN_RETURN_IF_ERROR(up.bf16(b + ".gate_proj.weight", I, H, gu + e * 2 * I * H));
      KILN_RETURN_IF_ERROR(up.bf16(b + ".up_proj.weight", I, H, gu + e * 2 * I * H + I * H));
      KILN_RETURN_IF_ERROR(up.bf16(b + ".down_proj.weight", H, I, dn + e * H * I));
    }
    KILN_RETURN_IF_ERROR(up.finish());
    return std::unique_ptr<ExpertSet>(new DenseCudaExpertSet(spec.prefix, dev_, gu, dn, E, H, I));
  }

 private:
  CudaDeviceContext& dev_;
};

}  // namespace

Result<std::unique_ptr<WeightFormat>> create_dense_cuda_weight_format(const CreateContext& ctx) {
  auto* dev = dynamic_cast<CudaDeviceContext*>(ctx.device_context);
  if (!dev)
    return failed_precondition("the `dense` weight format on CUDA needs the core's CUDA device context");
  return std::unique_ptr<WeightFormat>(new DenseCudaWeightFormat(*dev));
}

}  // namespace kiln::builtin
