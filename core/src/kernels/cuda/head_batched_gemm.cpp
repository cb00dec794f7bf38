#include "kernels/cuda/head_batched_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace kiln::cuda {
namespace {

constexpr const char* kName = "cuda::head_batched_gemm_bf16";

Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string(kName) + ": " + what + ": " + cublasGetStatusString(s));
}

// cuBLASLt's column-major view of the row-major product: D (m × n, ld m) = Aᵀ · B with A = w_h (k × m, ld k) and
// B = x (k × n, ld x_ld), batch strides m·k, 0 (every head reads the same rows) and y_stride (≥ n·m).
struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  Layouts() = default;
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
  ~Layouts() {
    for (cublasLtMatrixLayout_t l : {a, b, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
  Status make(int64_t n, int64_t k, int64_t x_ld, int64_t m, int32_t heads, int64_t y_stride) {
    KILN_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, m, k), "A layout"));
    KILN_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, x_ld), "B layout"));
    KILN_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, m, n, m), "D layout"));
    const int64_t strides[3] = {m * k, 0, y_stride};
    cublasLtMatrixLayout_t all[3] = {a, b, d};
    for (int i = 0; i < 3; ++i) {
      KILN_RETURN_IF_ERROR(lt_status(
          cublasLtMatrixLayoutSetAttribute(all[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &heads, sizeof(heads)),
          "batch count"));
      KILN_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutSetAttribute(all[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                      &strides[i], sizeof(strides[i])),
                                     "batch stride"));
    }
    return ok_status();
  }
};

struct Desc {
  cublasLtMatmulDesc_t desc = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  Status make() {
    KILN_RETURN_IF_ERROR(lt_status(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc"));
    const cublasOperation_t t = CUBLAS_OP_T, no = CUBLAS_OP_N;
    KILN_RETURN_IF_ERROR(lt_status(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "transa"));
    return lt_status(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof(no)), "transb");
  }
};

// One cuBLASLt handle per device, and the algorithm chosen per one-head problem: both live for the process. A step's
// key count is a problem of its own, so a server sees many; past kMaxAlgos the choices are forgotten and made again
// (the same heuristic on the same problem gives the same algorithm, so the bits do not change).
constexpr size_t kMaxAlgos = 4096;
struct Problem {
  int device;
  int64_t n, k, x_ld, m, y_stride;
  auto tie() const { return std::tie(device, n, k, x_ld, m, y_stride); }
  bool operator<(const Problem& o) const { return tie() < o.tie(); }
};

std::mutex g_mu;
std::map<int, cublasLtHandle_t>* g_handles = new std::map<int, cublasLtHandle_t>();  // leaked: exit order

std::map<Problem, cublasLtMatmulAlgo_t>* g_algos = new std::map<Problem, cublasLtMatmulAlgo_t>();

Result<cublasLtHandle_t> handle_for(int device) {
  auto it = g_handles->find(device);
  if (it != g_handles->end()) return it->second;
  cublasLtHandle_t h = nullptr;
  KILN_RETURN_IF_ERROR(lt_status(cublasLtCreate(&h), "cublasLtCreate"));
  (*g_handles)[device] = h;
  return h;
}

// The heuristic's first algorithm for one head's problem posed as a batch of kProbeBatch heads. Chosen once per
// problem, so every later call — any head count — runs the same kernel configuration; posed as a fixed batch so the
// choice does not depend on the caller's head count (the batched kernels are not the lone-matrix ones).
constexpr int32_t kProbeBatch = 2;

Result<cublasLtMatmulAlgo_t> algo_for(cublasLtHandle_t h, const Desc& desc, const Problem& p) {
  auto it = g_algos->find(p);
  if (it != g_algos->end()) return it->second;
  Layouts one;
  KILN_RETURN_IF_ERROR(one.make(p.n, p.k, p.x_ld, p.m, kProbeBatch, p.y_stride));
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_RETURN_IF_ERROR(lt_status(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  const uint64_t workspace = kHeadBatchedGemmWorkspaceBytes;
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                          sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(h, desc.desc, one.a, one.b, one.d, one.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  KILN_RETURN_IF_ERROR(lt_status(s, "algorithm heuristic"));
  if (found < 1) return unimplemented(std::string(kName) + ": cuBLASLt has no algorithm for the problem");
  if (g_algos->size() >= kMaxAlgos) g_algos->clear();
  (*g_algos)[p] = result.algo;
  return result.algo;
}

}  // namespace

Status head_batched_gemm_bf16(const uint16_t* x, int64_t n, int64_t k, int64_t x_ld, const uint16_t* w, int64_t m,
                              int64_t heads, uint16_t* y, void* workspace, StreamHandle stream,
                              int64_t y_head_stride) {
  if (y_head_stride == 0) y_head_stride = n * m;
  if (n <= 0 || k <= 0 || m <= 0 || heads <= 0 || x_ld < k || !workspace || y_head_stride < n * m)
    return invalid_argument(std::string(kName) + ": need n, k, m, heads > 0, x_ld ≥ k, y_head_stride ≥ n·m and a workspace");
  if (n > INT32_MAX || k > INT32_MAX || m > INT32_MAX || heads > INT32_MAX)
    return out_of_range(std::string(kName) + ": shapes past 32-bit dimensions");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return internal_error(std::string(kName) + ": no current device");
  Desc desc;
  KILN_RETURN_IF_ERROR(desc.make());
  Layouts all;
  KILN_RETURN_IF_ERROR(all.make(n, k, x_ld, m, static_cast<int32_t>(heads), y_head_stride));
  std::lock_guard<std::mutex> lock(g_mu);  // the maps; cuBLASLt calls on one handle from several threads are safe
  KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, handle_for(device));
  KILN_ASSIGN_OR_RETURN(cublasLtMatmulAlgo_t algo, algo_for(h, desc, Problem{device, n, k, x_ld, m, y_head_stride}));
  cublasLtMatmulHeuristicResult_t check{};
  KILN_RETURN_IF_ERROR(
      lt_status(cublasLtMatmulAlgoCheck(h, desc.desc, all.a, all.b, all.d, all.d, &algo, &check), "algorithm check"));
  if (check.workspaceSize > kHeadBatchedGemmWorkspaceBytes)
    return unimplemented(std::string(kName) + ": the problem's algorithm needs more workspace at this head count");
  const float one = 1.0f, zero = 0.0f;
  return lt_status(cublasLtMatmul(h, desc.desc, &one, w, all.a, x, all.b, &zero, y, all.d, y, all.d, &algo, workspace,
                                  kHeadBatchedGemmWorkspaceBytes, stream),
                   "cublasLtMatmul");
}

}  // namespace kiln::cuda
