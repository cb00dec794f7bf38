#include "vision_tower_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "vision_flash_attention.h"
#include "vision_kernels.h"
#include "vision_tower.h"

namespace kiln::vision {
namespace {

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string("vision tower on CUDA: ") + what + ": " + cudaGetErrorString(e));
}

Status blas_ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string("vision tower on CUDA: cuBLAS ") + what + " failed (status " +
                        std::to_string(static_cast<int>(s)) + ")");
}

// Device memory that frees itself; grow() keeps the contents only up to the old size's need (none here).
struct DeviceBuffer {
  float* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  Status grow(size_t n) {
    if (n <= count) return ok_status();
    if (ptr) cudaFree(ptr);
    ptr = nullptr, count = 0;
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMalloc(&ptr, n * sizeof(float)), "allocating activations"));
    count = n;
    return ok_status();
  }
  Status upload(const std::vector<float>& host, cudaStream_t stream) {
    if (host.empty()) return ok_status();
    KILN_RETURN_IF_ERROR(grow(host.size()));
    return cuda_ok(cudaMemcpyAsync(ptr, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
                   "uploading weights");
  }
  const float* get() const { return ptr; }  // null when never filled (an absent bias)
};

struct Block {
  DeviceBuffer norm1, norm2, qkv_w, qkv_b, q_norm, k_norm, proj_w, proj_b, gate_w, gate_b, up_w, up_b, down_w, down_b;
};

}  // namespace

struct CudaVisionTower::Impl {
  VisionConfig c;
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  size_t score_bytes = 0;  // one query chunk's scores (heads × chunk × frame length floats) at most
  DeviceBuffer patch_w, patch_b, post_norm, down_w, down_b, merger_proj, merger_norm_w, merger_norm_b, merger_gate,
      merger_up, merger_down;
  std::vector<std::unique_ptr<Block>> blocks;
  // Activations, grown to the largest image.
  DeviceBuffer pixels, x, t, qkv, attn, gate, up, cos_t, sin_t, scores, y, z, mgate, mup;
  DeviceBuffer flash_ws;  // the flash kernel's bf16 q, k, v of the largest frame

  ~Impl() {
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  // y[rows, out] = x[rows, in] · wᵀ (+ b): row-major data as cuBLAS's column-major yᵀ = w · xᵀ.
  Status linear(const float* xin, int64_t rows, int64_t in, const DeviceBuffer& w, const DeviceBuffer& b, int64_t out,
                float* yout) {
    if (rows == 0) return ok_status();
    const float one = 1.0f, zero = 0.0f;
    KILN_RETURN_IF_ERROR(blas_ok(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                                              static_cast<int>(rows), static_cast<int>(in), &one, w.get(), CUDA_R_32F,
                                              static_cast<int>(in), xin, CUDA_R_32F, static_cast<int>(in), &zero, yout,
                                              CUDA_R_32F, static_cast<int>(out), compute, CUBLAS_GEMM_DEFAULT),
                                 "linear"));
    if (b.get()) cuda::add_bias(yout, b.get(), rows, out, stream);
    return ok_status();
  }

  // Non-causal attention of every head within the frame [start, start + len) of qkv into attn: the flash kernel
  // (bf16 tensor cores) in the TF32 tower where the head width allows, else cuBLAS around a row softmax.
  Status attend(int64_t start, int64_t len) {
    const int64_t h = c.hidden_size, hd = c.head_dim(), heads = c.num_heads;
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && cuda::flash_attention_supported(hd)) {
      KILN_RETURN_IF_ERROR(flash_ws.grow((cuda::flash_attention_workspace_bytes(len, heads, hd) + 3) / 4));
      return cuda_ok(cuda::flash_attention_frame(qkv.ptr, attn.ptr, start, len, heads, hd,
                                                 1.0f / std::sqrt(static_cast<float>(hd)), flash_ws.ptr, stream),
                     "flash attention");
    }
    const int64_t chunk =
        std::clamp<int64_t>(static_cast<int64_t>(score_bytes / (sizeof(float) * heads * len)), 1, len);
    KILN_RETURN_IF_ERROR(scores.grow(static_cast<size_t>(heads * chunk * len)));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd)), one = 1.0f, zero = 0.0f;
    const float* k = qkv.ptr + start * 3 * h + h;
    const float* v = qkv.ptr + start * 3 * h + 2 * h;
    for (int64_t q0 = 0; q0 < len; q0 += chunk) {
      const int64_t qn = std::min(chunk, len - q0);
      const float* q = qkv.ptr + (start + q0) * 3 * h;
      // scores[head] (qn × len, row-major) = q · kᵀ · scale: column-major scoresᵀ = k · qᵀ.
      KILN_RETURN_IF_ERROR(blas_ok(
          cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(len), static_cast<int>(qn),
                                     static_cast<int>(hd), &scale, k, CUDA_R_32F, static_cast<int>(3 * h), hd, q,
                                     CUDA_R_32F, static_cast<int>(3 * h), hd, &zero, scores.ptr, CUDA_R_32F,
                                     static_cast<int>(len), qn * len, static_cast<int>(heads), compute,
                                     CUBLAS_GEMM_DEFAULT),
          "attention scores"));
      cuda::softmax_rows(scores.ptr, heads * qn, len, stream);
      // out[head] (qn × hd) = p · v: column-major outᵀ = vᵀ · pᵀ, written into the head's columns of attn.
      KILN_RETURN_IF_ERROR(blas_ok(
          cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(hd), static_cast<int>(qn),
                                     static_cast<int>(len), &one, v, CUDA_R_32F, static_cast<int>(3 * h), hd,
                                     scores.ptr, CUDA_R_32F, static_cast<int>(len), qn * len, &zero,
                                     attn.ptr + (start + q0) * h, CUDA_R_32F, static_cast<int>(h), hd,
                                     static_cast<int>(heads), compute, CUBLAS_GEMM_DEFAULT),
          "attention output"));
    }
    return ok_status();
  }

  Status block(const Block& w, int64_t n, const std::vector<int64_t>& segments) {
    const int64_t h = c.hidden_size, inter = c.intermediate_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    cuda::rms_norm_rows(x.ptr, t.ptr, w.norm1.get(), n, h, eps, stream);
    KILN_RETURN_IF_ERROR(linear(t.ptr, n, h, w.qkv_w, w.qkv_b, 3 * h, qkv.ptr));
    cuda::qk_norm_rope(qkv.ptr, w.q_norm.get(), w.k_norm.get(), cos_t.ptr, sin_t.ptr, n, c.num_heads, c.head_dim(), eps,
                       stream);
    int64_t start = 0;
    for (int64_t len : segments) {
      KILN_RETURN_IF_ERROR(attend(start, len));
      start += len;
    }
    KILN_RETURN_IF_ERROR(linear(attn.ptr, n, h, w.proj_w, w.proj_b, h, t.ptr));
    cuda::add_into(x.ptr, t.ptr, n * h, stream);
    cuda::rms_norm_rows(x.ptr, t.ptr, w.norm2.get(), n, h, eps, stream);
    KILN_RETURN_IF_ERROR(linear(t.ptr, n, h, w.gate_w, w.gate_b, inter, gate.ptr));
    KILN_RETURN_IF_ERROR(linear(t.ptr, n, h, w.up_w, w.up_b, inter, up.ptr));
    cuda::clamped_swiglu(gate.ptr, up.ptr, n * inter, static_cast<float>(c.swiglu_limit), stream);
    KILN_RETURN_IF_ERROR(linear(gate.ptr, n, inter, w.down_w, w.down_b, h, t.ptr));
    cuda::add_into(x.ptr, t.ptr, n * h, stream);
    return ok_status();
  }
};

CudaVisionTower::CudaVisionTower(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaVisionTower::~CudaVisionTower() {
  if (impl_) cudaSetDevice(impl_->device);
}

Result<std::unique_ptr<CudaVisionTower>> CudaVisionTower::create(const VisionConfig& config,
                                                                 const VisionWeights& weights, int device, Math math,
                                                                 size_t score_bytes) {
  if (config.head_dim() > 512) return unimplemented("vision heads wider than 512 channels");
  auto impl = std::make_unique<Impl>();
  impl->c = config;
  impl->device = device;
  impl->compute = math == Math::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  impl->score_bytes = score_bytes;
  KILN_RETURN_IF_ERROR(cuda_ok(cudaSetDevice(device), "selecting the device"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "creating a stream"));
  KILN_RETURN_IF_ERROR(blas_ok(cublasCreate(&impl->blas), "handle"));
  KILN_RETURN_IF_ERROR(blas_ok(cublasSetStream(impl->blas, impl->stream), "stream"));
  cudaStream_t s = impl->stream;
  Impl& m = *impl;
  size_t bytes = 0;
  auto up = [&](DeviceBuffer& d, const std::vector<float>& hst) {
    bytes += hst.size() * sizeof(float);
    return d.upload(hst, s);
  };
  KILN_RETURN_IF_ERROR(up(m.patch_w, weights.patch_w));
  KILN_RETURN_IF_ERROR(up(m.patch_b, weights.patch_b));
  for (const VisionBlockWeights& w : weights.blocks) {
    auto b = std::make_unique<Block>();
    for (auto [d, hst] : {std::pair{&b->norm1, &w.norm1}, {&b->norm2, &w.norm2}, {&b->qkv_w, &w.qkv_w},
                          {&b->qkv_b, &w.qkv_b}, {&b->q_norm, &w.q_norm}, {&b->k_norm, &w.k_norm},
                          {&b->proj_w, &w.proj_w}, {&b->proj_b, &w.proj_b}, {&b->gate_w, &w.gate_w},
                          {&b->gate_b, &w.gate_b}, {&b->up_w, &w.up_w}, {&b->up_b, &w.up_b}, {&b->down_w, &w.down_w},
                          {&b->down_b, &w.down_b}})
      KILN_RETURN_IF_ERROR(up(*d, *hst));
    m.blocks.push_back(std::move(b));
  }
  for (auto [d, hst] :
       {std::pair{&m.post_norm, &weights.post_norm}, {&m.down_w, &weights.down_w}, {&m.down_b, &weights.down_b},
        {&m.merger_proj, &weights.merger_proj}, {&m.merger_norm_w, &weights.merger_norm_w},
        {&m.merger_norm_b, &weights.merger_norm_b}, {&m.merger_gate, &weights.merger_gate},
        {&m.merger_up, &weights.merger_up}, {&m.merger_down, &weights.merger_down}})
    KILN_RETURN_IF_ERROR(up(*d, *hst));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(s), "uploading weights"));
  std::unique_ptr<CudaVisionTower> tower(new CudaVisionTower(std::move(impl)));
  tower->weight_bytes_ = bytes;
  return tower;
}

Result<std::vector<float>> CudaVisionTower::run(std::span<const float> pixel_values,
                                                std::span<const std::array<int64_t, 3>> grids) {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& m = *impl_;
  const VisionConfig& c = m.c;
  KILN_ASSIGN_OR_RETURN(const int64_t n, check_tower_input(c, pixel_values.size(), grids));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaSetDevice(m.device), "selecting the device"));
  std::vector<int64_t> rows, cols, segments;
  patch_positions(grids, c.spatial_merge_size, rows, cols, segments);
  std::vector<float> cos_h, sin_h;
  axial_rope_tables(c, rows, cols, cos_h, sin_h);

  const int64_t h = c.hidden_size, mm = c.spatial_merge_size * c.spatial_merge_size;
  const int64_t tokens = n / mm, out = c.out_hidden_size, pi = c.projection_intermediate_size;
  const auto N = static_cast<size_t>(n);
  for (auto [buf, count] : {std::pair{&m.pixels, N * c.patch_dim()}, {&m.x, N * h}, {&m.t, N * h},
                            {&m.qkv, N * 3 * h}, {&m.attn, N * h}, {&m.gate, N * c.intermediate_size},
                            {&m.up, N * c.intermediate_size}, {&m.y, static_cast<size_t>(tokens * out)},
                            {&m.z, static_cast<size_t>(tokens * out)}, {&m.mgate, static_cast<size_t>(tokens * pi)},
                            {&m.mup, static_cast<size_t>(tokens * pi)}})
    KILN_RETURN_IF_ERROR(buf->grow(count));
  KILN_RETURN_IF_ERROR(m.cos_t.upload(cos_h, m.stream));
  KILN_RETURN_IF_ERROR(m.sin_t.upload(sin_h, m.stream));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(m.pixels.ptr, pixel_values.data(), pixel_values.size() * sizeof(float),
                                               cudaMemcpyHostToDevice, m.stream),
                               "uploading pixel_values"));

  KILN_RETURN_IF_ERROR(m.linear(m.pixels.ptr, n, c.patch_dim(), m.patch_w, m.patch_b, h, m.x.ptr));
  for (const auto& block : m.blocks) KILN_RETURN_IF_ERROR(m.block(*block, n, segments));
  const float eps = static_cast<float>(c.rms_norm_eps);
  cuda::rms_norm_rows(m.x.ptr, m.x.ptr, m.post_norm.get(), n, h, eps, m.stream);
  // Downsample: a merge block's consecutive rows are one row of [tokens, mm·h].
  KILN_RETURN_IF_ERROR(m.linear(m.x.ptr, tokens, mm * h, m.down_w, m.down_b, out, m.y.ptr));
  const DeviceBuffer none;
  KILN_RETURN_IF_ERROR(m.linear(m.y.ptr, tokens, out, m.merger_proj, none, out, m.z.ptr));
  cuda::layer_norm_rows(m.z.ptr, m.merger_norm_w.get(), m.merger_norm_b.get(), tokens, out, 1e-5f, m.stream);
  cuda::gelu(m.z.ptr, tokens * out, m.stream);
  KILN_RETURN_IF_ERROR(m.linear(m.z.ptr, tokens, out, m.merger_gate, none, pi, m.mgate.ptr));
  KILN_RETURN_IF_ERROR(m.linear(m.z.ptr, tokens, out, m.merger_up, none, pi, m.mup.ptr));
  cuda::clamped_swiglu(m.mgate.ptr, m.mup.ptr, tokens * pi, static_cast<float>(c.swiglu_limit), m.stream);
  KILN_RETURN_IF_ERROR(m.linear(m.mgate.ptr, tokens, pi, m.merger_down, none, out, m.y.ptr));
  std::vector<float> result(static_cast<size_t>(tokens * out));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(result.data(), m.y.ptr, result.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, m.stream),
                               "downloading embeddings"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaStreamSynchronize(m.stream), "running the tower"));
  KILN_RETURN_IF_ERROR(cuda_ok(cudaGetLastError(), "a tower kernel"));
  return result;
}

}  // namespace kiln::vision
