#include "dflash_cuda_model.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "dflash_cuda_kernels.h"

namespace kiln::dflash {
namespace {

// Context rows per pass of the fc / k,v projections: a prompt's rows go through in chunks, so the scratch does not
// grow with max_num_batched_tokens × taps × hidden.
constexpr int64_t kContextChunk = 256;

size_t align(size_t b) { return (b + 255) / 256 * 256; }

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string("dflash drafter (CUDA): ") + what + ": " + cudaGetErrorString(e));
}

uint16_t to_bf16(float f) {  // round to nearest even (the checkpoint's bf16 values come back exactly)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

struct LayerLinears {
  std::unique_ptr<Linear> qkv, kv, o, gate_up, down, attention_conv, mlp_conv;
  float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  float *attention_base = nullptr, *mlp_base = nullptr;  // [2·T, H]
};

// Bytes laid out back to back (16-byte aligned) on the host, copied to the device in one go.
class HostPack {
 public:
  void clear() { bytes_.clear(); }
  template <typename T>
  size_t add(const T* data, size_t n) {
    const size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + n * sizeof(T));
    if (n) std::memcpy(bytes_.data() + at, data, n * sizeof(T));
    return at;
  }
  template <typename T>
  size_t add(const std::vector<T>& v) { return add(v.data(), v.size()); }
  size_t size() const { return bytes_.size(); }
  const uint8_t* data() const { return bytes_.data(); }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

struct DflashCudaModel::Impl {
  cudaStream_t stream = nullptr;
  Device device;
  std::unique_ptr<Linear> fc, selector;
  float *hidden_norm = nullptr, *norm = nullptr;
  uint16_t *predecessor = nullptr, *successor = nullptr;
  std::vector<LayerLinears> layers;
  std::vector<uint8_t*> k_cache, v_cache;

  // Context scratch (kContextChunk rows).
  uint16_t* feat = nullptr;
  float* ctx = nullptr;
  uint16_t* ctx_bf16 = nullptr;
  float* kv = nullptr;
  // Block scratch, for block_rows rows and draft_rows drafts.
  int64_t block_rows = 0, draft_rows = 0, width = 0;
  float *h = nullptr, *x = nullptr, *y = nullptr, *conv_d = nullptr, *qkv = nullptr, *gu = nullptr, *g = nullptr;
  uint16_t *xb = nullptr, *emb = nullptr, *attn = nullptr, *act = nullptr, *normed = nullptr;
  float* cand_values = nullptr;
  int32_t* cand_ids = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The step's metadata: packed on the host, staged in pinned memory (a copy from pageable memory may wait for the
  // stream), copied to `meta` on the stream; `uploaded` marks when the stream has read the staging buffer.
  HostPack pack;
  uint8_t* meta = nullptr;
  size_t meta_bytes = 0;
  uint8_t* pinned = nullptr;
  size_t pinned_bytes = 0;
  cudaEvent_t uploaded = nullptr;
  bool upload_pending = false;

  ~Impl() {
    if (upload_pending) cudaEventSynchronize(uploaded);
    if (pinned) cudaFreeHost(pinned);
    if (uploaded) cudaEventDestroy(uploaded);
  }

  // Copies the pack to `meta` without waiting for the stream: the previous step's upload (long done in practice) is
  // the only thing waited for, before its staging buffer is rewritten.
  Status upload_pack() {
    if (!uploaded) KILN_RETURN_IF_ERROR(cuda_ok(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming), "event"));
    if (upload_pending) KILN_RETURN_IF_ERROR(cuda_ok(cudaEventSynchronize(uploaded), "staging the step's metadata"));
    upload_pending = false;
    if (pack.size() > pinned_bytes) {
      if (pinned) KILN_RETURN_IF_ERROR(cuda_ok(cudaFreeHost(pinned), "staging the step's metadata"));
      pinned = nullptr;
      const size_t bytes = std::max(pack.size(), 2 * pinned_bytes);
      void* p = nullptr;
      KILN_RETURN_IF_ERROR(cuda_ok(cudaMallocHost(&p, bytes), "staging the step's metadata"));
      pinned = static_cast<uint8_t*>(p);
      pinned_bytes = bytes;
    }
    std::memcpy(pinned, pack.data(), pack.size());
    KILN_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(meta, pinned, pack.size(), cudaMemcpyHostToDevice, stream),
                                 "copying the step's metadata"));
    KILN_RETURN_IF_ERROR(cuda_ok(cudaEventRecord(uploaded, stream), "event"));
    upload_pending = true;
    return ok_status();
  }
  size_t at_tap_rows = 0, at_ctx_positions = 0, at_slots = 0, at_ids = 0, at_positions = 0, at_local = 0,
         at_block_start = 0, at_block_len = 0, at_seq = 0, at_tables = 0, at_table_offset = 0, at_draft_src = 0,
         at_first_row = 0, at_depth = 0, at_anchor = 0, at_temperature = 0, at_uniforms = 0;
  template <typename T>
  T* m(size_t at) const { return reinterpret_cast<T*>(meta + at); }

  Status linear(const Linear& l, const void* x_bf16, int64_t n, void* out, DType out_dtype, bool accumulate = false) {
    LinearRun r;
    r.x = TensorView::contiguous(const_cast<void*>(x_bf16), DType::kBF16, {n, l.in_features()}, device);
    r.y = TensorView::contiguous(out, out_dtype, {n, l.out_features()}, device);
    r.accumulate = accumulate;
    r.workspace = workspace;
    r.workspace_bytes = workspace_bytes;
    return l.run(r, Stream{device, stream});
  }
};

DflashCudaModel::DflashCudaModel(DraftServices& services, DflashConfig config, KvDtype kv)
    : s_(services), c_(std::move(config)), kv_(kv), m_(std::make_unique<Impl>()) {}
DflashCudaModel::~DflashCudaModel() = default;

size_t DflashCudaModel::kv_row_bytes() const {
  return static_cast<size_t>(c_.kv_heads * c_.head_dim) * (kv_ == KvDtype::kBf16 ? 2 : 1);
}

int64_t DflashCudaModel::q_width(bool sampled) const {
  if (c_.v2) return c_.selector_top_k;
  return sampled ? std::min<int64_t>(cuda::kMaxTopK, c_.vocab) : 1;
}

Result<void*> DflashCudaModel::device_alloc(size_t bytes, const char* what) {
  return s_.device().allocate(std::max<size_t>(bytes, 256), what);
}

Result<std::unique_ptr<DflashCudaModel>> DflashCudaModel::load(DraftServices& services, const WeightSource& source,
                                                               DflashConfig config, const DflashWeights& host,
                                                               KvDtype kv) {
  const DflashConfig& c = config;
  const std::string who = c.path + ": the CUDA drafter ";
  if (c.head_dim % 64 != 0 || c.head_dim > cuda::kMaxHeadDim)
    return unimplemented(who + "needs head_dim a multiple of 64 up to " + std::to_string(cuda::kMaxHeadDim) + ", not " +
                         std::to_string(c.head_dim));
  if (static_cast<int64_t>(c.target_layers.size()) > cuda::kMaxTaps)
    return unimplemented(who + "taps at most " + std::to_string(cuda::kMaxTaps) + " target layers");
  if (c.v2 && c.selector_top_k > cuda::kMaxTopK)
    return unimplemented(who + "walks at most " + std::to_string(cuda::kMaxTopK) + " candidates (selector_top_k " +
                         std::to_string(c.selector_top_k) + ")");
  std::unique_ptr<DflashCudaModel> model(new DflashCudaModel(services, std::move(config), kv));
  DflashCudaModel& d = *model;
  Impl& m = *d.m_;
  m.device = services.device().device();
  m.stream = static_cast<cudaStream_t>(services.device().stream().handle);
  const DflashConfig& cf = d.c_;
  const int64_t H = cf.hidden, hd = cf.head_dim, nh = cf.heads, nkv = cf.kv_heads, I = cf.intermediate;
  const std::string pre = source.has("fc.weight") ? "" : "model.";
  WeightFormat& format = services.weight_format();
  auto load_linear = [&](std::vector<std::string> names, std::vector<int64_t> outs,
                         int64_t in) -> Result<std::unique_ptr<Linear>> {
    LinearSpec spec;
    for (std::string& n : names) spec.names.push_back(pre + n);
    spec.out_features = std::move(outs);
    spec.in_features = in;
    return format.load_linear(source, spec);
  };
  auto upload = [&](const std::vector<float>& v, const char* what) -> Result<float*> {
    KILN_ASSIGN_OR_RETURN(void* p, d.device_alloc(v.size() * 4, what));
    KILN_RETURN_IF_ERROR(services.device().copy(p, v.data(), v.size() * 4, false));
    return static_cast<float*>(p);
  };
  const int64_t taps = static_cast<int64_t>(cf.target_layers.size());
  KILN_ASSIGN_OR_RETURN(m.fc, load_linear({"fc"}, {H}, taps * H));
  KILN_ASSIGN_OR_RETURN(m.hidden_norm, upload(host.hidden_norm, "dflash hidden_norm"));
  KILN_ASSIGN_OR_RETURN(m.norm, upload(host.norm, "dflash norm"));
  const int64_t conv_out = cf.v2 ? 2 * cf.conv_taps * (H / cf.conv_group) : 0;
  for (int64_t i = 0; i < cf.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const LayerWeights& hl = host.layers[i];
    LayerLinears l;
    KILN_ASSIGN_OR_RETURN(l.qkv, load_linear({p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"},
                                             {nh * hd, nkv * hd, nkv * hd}, H));
    KILN_ASSIGN_OR_RETURN(l.kv, load_linear({p + "self_attn.k_proj", p + "self_attn.v_proj"}, {nkv * hd, nkv * hd}, H));
    KILN_ASSIGN_OR_RETURN(l.o, load_linear({p + "self_attn.o_proj"}, {H}, nh * hd));
    KILN_ASSIGN_OR_RETURN(l.gate_up, load_linear({p + "mlp.gate_proj", p + "mlp.up_proj"}, {I, I}, H));
    KILN_ASSIGN_OR_RETURN(l.down, load_linear({p + "mlp.down_proj"}, {H}, I));
    KILN_ASSIGN_OR_RETURN(l.input_norm, upload(hl.input_norm, "dflash norms"));
    KILN_ASSIGN_OR_RETURN(l.post_norm, upload(hl.post_norm, "dflash norms"));
    KILN_ASSIGN_OR_RETURN(l.q_norm, upload(hl.q_norm, "dflash norms"));
    KILN_ASSIGN_OR_RETURN(l.k_norm, upload(hl.k_norm, "dflash norms"));
    if (cf.v2) {
      KILN_ASSIGN_OR_RETURN(l.attention_conv, load_linear({p + "attention_conv.kernel_projection"}, {conv_out}, H));
      KILN_ASSIGN_OR_RETURN(l.mlp_conv, load_linear({p + "mlp_conv.kernel_projection"}, {conv_out}, H));
      KILN_ASSIGN_OR_RETURN(l.attention_base, upload(hl.attention_conv.base.w, "dflash conv kernels"));
      KILN_ASSIGN_OR_RETURN(l.mlp_base, upload(hl.mlp_conv.base.w, "dflash conv kernels"));
    }
    m.layers.push_back(std::move(l));
    m.k_cache.push_back(nullptr);
    m.v_cache.push_back(nullptr);
  }
  std::vector<uint16_t> a, b;
  if (cf.v2) {
    KILN_ASSIGN_OR_RETURN(m.selector, load_linear({"candidate_selector.hidden_projection"}, {cf.selector_rank}, H));
    // The codebooks in bf16: the checkpoint's own precision, half the bytes of fp32 at a real vocabulary.
    for (float f : host.predecessor.w) a.push_back(to_bf16(f));
    for (float f : host.successor.w) b.push_back(to_bf16(f));
    KILN_ASSIGN_OR_RETURN(void* pa, d.device_alloc(a.size() * 2, "dflash selector codebooks"));
    KILN_ASSIGN_OR_RETURN(void* pb, d.device_alloc(b.size() * 2, "dflash selector codebooks"));
    KILN_RETURN_IF_ERROR(services.device().copy(pa, a.data(), a.size() * 2, false));
    KILN_RETURN_IF_ERROR(services.device().copy(pb, b.data(), b.size() * 2, false));
    m.predecessor = static_cast<uint16_t*>(pa);
    m.successor = static_cast<uint16_t*>(pb);
  }
  // Context scratch.
  const int64_t C = kContextChunk, kvw = nkv * hd;
  KILN_ASSIGN_OR_RETURN(void* feat, d.device_alloc(static_cast<size_t>(C * taps * H) * 2, "dflash context scratch"));
  KILN_ASSIGN_OR_RETURN(void* ctx, d.device_alloc(static_cast<size_t>(C * H) * 4, "dflash context scratch"));
  KILN_ASSIGN_OR_RETURN(void* ctxb, d.device_alloc(static_cast<size_t>(C * H) * 2, "dflash context scratch"));
  KILN_ASSIGN_OR_RETURN(void* kvb, d.device_alloc(static_cast<size_t>(C * 2 * kvw) * 4, "dflash context scratch"));
  m.feat = static_cast<uint16_t*>(feat);
  m.ctx = static_cast<float*>(ctx);
  m.ctx_bf16 = static_cast<uint16_t*>(ctxb);
  m.kv = static_cast<float*>(kvb);
  KILN_RETURN_IF_ERROR(d.ensure_block_capacity(C, 1, d.q_width(true)));
  // The host copies above read pageable memory that goes out of scope here.
  KILN_RETURN_IF_ERROR(services.device().synchronize());
  return model;
}

// Scratch grows (by doubling) to the largest step seen; the device memory lives as long as the model.
Status DflashCudaModel::ensure_block_capacity(int64_t rows, int64_t draft_rows, int64_t width) {
  Impl& m = *m_;
  const int64_t H = c_.hidden, hd = c_.head_dim, nh = c_.heads, nkv = c_.kv_heads, I = c_.intermediate;
  if (rows > m.block_rows) {
    const int64_t N = std::max(rows, 2 * m.block_rows);
    const int64_t conv_w = c_.v2 ? 2 * c_.conv_taps * (H / c_.conv_group) : 1;
    auto f32 = [&](int64_t n) -> Result<float*> {
      KILN_ASSIGN_OR_RETURN(void* p, device_alloc(static_cast<size_t>(n) * 4, "dflash block scratch"));
      return static_cast<float*>(p);
    };
    auto bf16 = [&](int64_t n) -> Result<uint16_t*> {
      KILN_ASSIGN_OR_RETURN(void* p, device_alloc(static_cast<size_t>(n) * 2, "dflash block scratch"));
      return static_cast<uint16_t*>(p);
    };
    KILN_ASSIGN_OR_RETURN(m.h, f32(N * H));
    KILN_ASSIGN_OR_RETURN(m.x, f32(N * H));
    KILN_ASSIGN_OR_RETURN(m.y, f32(N * H));
    KILN_ASSIGN_OR_RETURN(m.conv_d, f32(N * conv_w));
    KILN_ASSIGN_OR_RETURN(m.qkv, f32(N * (nh + 2 * nkv) * hd));
    KILN_ASSIGN_OR_RETURN(m.gu, f32(N * 2 * I));
    KILN_ASSIGN_OR_RETURN(m.xb, bf16(N * H));
    KILN_ASSIGN_OR_RETURN(m.emb, bf16(N * H));
    KILN_ASSIGN_OR_RETURN(m.attn, bf16(N * nh * hd));
    KILN_ASSIGN_OR_RETURN(m.act, bf16(N * I));
    // Linears' workspace for the most rows any of them runs (context chunks or blocks).
    const int64_t most = std::max(N, kContextChunk);
    size_t ws = m.fc->workspace_bytes(most, Epilogue::kNone);
    if (m.selector) ws = std::max(ws, m.selector->workspace_bytes(most, Epilogue::kNone));
    for (const LayerLinears& l : m.layers)
      for (const Linear* p : {l.qkv.get(), l.kv.get(), l.o.get(), l.gate_up.get(), l.down.get(), l.attention_conv.get(),
                              l.mlp_conv.get()})
        if (p) ws = std::max(ws, p->workspace_bytes(most, Epilogue::kNone));
    if (ws > m.workspace_bytes) {
      KILN_ASSIGN_OR_RETURN(m.workspace, device_alloc(align(ws), "dflash linear workspace"));
      m.workspace_bytes = align(ws);
    }
    m.block_rows = N;
  }
  if (draft_rows > m.draft_rows || width > m.width) {
    const int64_t M = std::max(draft_rows, 2 * m.draft_rows), W = std::max(width, m.width);
    KILN_ASSIGN_OR_RETURN(void* normed, device_alloc(static_cast<size_t>(M * c_.hidden) * 2, "dflash draft rows"));
    KILN_ASSIGN_OR_RETURN(void* logits, device_alloc(static_cast<size_t>(M * c_.vocab) * 4, "dflash draft logits"));
    KILN_ASSIGN_OR_RETURN(void* g, device_alloc(static_cast<size_t>(M * std::max<int64_t>(c_.selector_rank, 1)) * 4,
                                                "dflash draft rows"));
    KILN_ASSIGN_OR_RETURN(void* ci, device_alloc(static_cast<size_t>(M * W) * 4, "dflash candidates"));
    KILN_ASSIGN_OR_RETURN(void* cv, device_alloc(static_cast<size_t>(M * W) * 4, "dflash candidates"));
    KILN_ASSIGN_OR_RETURN(void* tk, device_alloc(static_cast<size_t>(M) * 4, "dflash drafts"));
    KILN_ASSIGN_OR_RETURN(void* qi, device_alloc(static_cast<size_t>(M * W) * 4, "dflash q ids"));
    KILN_ASSIGN_OR_RETURN(void* qp, device_alloc(static_cast<size_t>(M * W) * 4, "dflash q"));
    m.normed = static_cast<uint16_t*>(normed);
    logits_ = static_cast<float*>(logits);
    m.g = static_cast<float*>(g);
    m.cand_ids = static_cast<int32_t*>(ci);
    m.cand_values = static_cast<float*>(cv);
    tokens_ = static_cast<int32_t*>(tk);
    q_ids_ = static_cast<int32_t*>(qi);
    q_probs_ = static_cast<float*>(qp);
    m.draft_rows = M;
    m.width = W;
  }
  return ok_status();
}

Status DflashCudaModel::run(const std::vector<TensorView>& taps, const std::vector<ContextRow>& rows,
                            const std::vector<DraftBlock>& blocks) {
  Impl& m = *m_;
  if (taps.size() != c_.target_layers.size())
    return invalid_argument("dflash drafter (CUDA): " + std::to_string(taps.size()) + " taps given, it taps " +
                            std::to_string(c_.target_layers.size()));
  for (const TensorView& t : taps)
    if (!t.device.is_cuda() || t.dtype != DType::kF32 || t.dim(-1) != c_.hidden)
      return invalid_argument("dflash drafter (CUDA): taps must be fp32 [rows, " + std::to_string(c_.hidden) +
                              "] on the device");
  // The pool may be attached (or remade) after the drafter: its pages are looked up every step.
  for (size_t l = 0; l < m.k_cache.size(); ++l) {
    m.k_cache[l] = static_cast<uint8_t*>(s_.cache(static_cast<int64_t>(l), 0));
    m.v_cache[l] = static_cast<uint8_t*>(s_.cache(static_cast<int64_t>(l), 1));
    if (!m.k_cache[l] || !m.v_cache[l])
      return failed_precondition("dflash drafter (CUDA): the engine lent no cache for the drafter's layer " +
                                 std::to_string(l));
  }

  // The step's metadata, packed and copied to the device once.
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<int32_t> tap_rows(R), ctx_pos(R);
  std::vector<int64_t> slots(R);
  for (int64_t i = 0; i < R; ++i) tap_rows[i] = rows[i].tap_row, ctx_pos[i] = static_cast<int32_t>(rows[i].position),
                                  slots[i] = rows[i].slot;
  std::vector<int32_t> ids, pos, local, start, len, seq, tables, table_offset, draft_src, first_row, depth, anchor;
  std::vector<float> temperature;
  std::vector<double> uniforms;
  bool sampled = false;
  first_rows_.clear();
  for (size_t b = 0; b < blocks.size(); ++b) {
    const DraftBlock& k = blocks[b];
    const int32_t s0 = static_cast<int32_t>(ids.size());
    table_offset.push_back(static_cast<int32_t>(tables.size()));
    tables.insert(tables.end(), k.block_table, k.block_table + k.num_blocks);
    first_row.push_back(static_cast<int32_t>(draft_src.size()));
    first_rows_.push_back(static_cast<int64_t>(draft_src.size()));
    depth.push_back(k.depth);
    anchor.push_back(k.anchor);
    temperature.push_back(k.temperature);
    sampled |= k.temperature > 0;
    for (int i = 0; i <= k.depth; ++i) {
      ids.push_back(i == 0 ? k.anchor : c_.mask_token);
      pos.push_back(static_cast<int32_t>(k.anchor_position + i));
      local.push_back(i);
      start.push_back(s0);
      len.push_back(k.depth + 1);
      seq.push_back(static_cast<int32_t>(b));
      if (i > 0) {
        draft_src.push_back(s0 + i);
        uniforms.push_back(k.temperature > 0 ? k.uniforms[static_cast<size_t>(i - 1)] : 0.0);
      }
    }
  }
  const int64_t N = static_cast<int64_t>(ids.size()), M = static_cast<int64_t>(draft_src.size());
  draft_rows_ = M;
  walk_width_ = q_width(sampled);
  KILN_RETURN_IF_ERROR(ensure_block_capacity(N, M, walk_width_));
  HostPack& p = m.pack;
  p.clear();
  m.at_tap_rows = p.add(tap_rows);
  m.at_ctx_positions = p.add(ctx_pos);
  m.at_slots = p.add(slots);
  m.at_ids = p.add(ids);
  m.at_positions = p.add(pos);
  m.at_local = p.add(local);
  m.at_block_start = p.add(start);
  m.at_block_len = p.add(len);
  m.at_seq = p.add(seq);
  m.at_tables = p.add(tables);
  m.at_table_offset = p.add(table_offset);
  m.at_draft_src = p.add(draft_src);
  m.at_first_row = p.add(first_row);
  m.at_depth = p.add(depth);
  m.at_anchor = p.add(anchor);
  m.at_temperature = p.add(temperature);
  m.at_uniforms = p.add(uniforms);
  if (p.size() > m.meta_bytes) {
    const size_t bytes = std::max(p.size(), 2 * m.meta_bytes);
    KILN_ASSIGN_OR_RETURN(void* meta, device_alloc(bytes, "dflash step metadata"));
    m.meta = static_cast<uint8_t*>(meta);
    m.meta_bytes = bytes;
  }
  KILN_RETURN_IF_ERROR(m.upload_pack());

  KILN_RETURN_IF_ERROR(forward_context(taps, R));
  if (M > 0) KILN_RETURN_IF_ERROR(forward_blocks(N, M, static_cast<int64_t>(blocks.size())));
  return ok_status();
}

Status DflashCudaModel::forward_context(const std::vector<TensorView>& taps, int64_t rows) {
  Impl& m = *m_;
  const int64_t H = c_.hidden;
  const bool fp8 = kv_ == KvDtype::kFp8;
  cuda::TapPointers tp{};
  for (size_t t = 0; t < taps.size(); ++t) tp.p[t] = taps[t].as<const float>();
  for (int64_t r0 = 0; r0 < rows; r0 += kContextChunk) {
    const int64_t n = std::min(kContextChunk, rows - r0);
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::gather_taps(tp, static_cast<int>(taps.size()), H, m.m<int32_t>(m.at_tap_rows) + r0,
                                                   n, m.feat, m.stream), "gathering taps"));
    KILN_RETURN_IF_ERROR(m.linear(*m.fc, m.feat, n, m.ctx, DType::kF32));
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::rms_norm(m.ctx, nullptr, m.hidden_norm, n, H, c_.rms_eps, nullptr, m.ctx_bf16,
                                                m.stream), "hidden_norm"));
    for (int64_t l = 0; l < c_.layers; ++l) {
      KILN_RETURN_IF_ERROR(m.linear(*m.layers[l].kv, m.ctx_bf16, n, m.kv, DType::kF32));
      KILN_RETURN_IF_ERROR(cuda_ok(
          cuda::write_context_kv(m.kv, m.layers[l].k_norm, m.m<int32_t>(m.at_ctx_positions) + r0,
                                 m.m<int64_t>(m.at_slots) + r0, n, static_cast<int>(c_.kv_heads),
                                 static_cast<int>(c_.head_dim), c_.rms_eps, c_.rope_theta, fp8, m.k_cache[l],
                                 m.v_cache[l], m.stream),
          "writing context K/V"));
    }
  }
  return ok_status();
}

Status DflashCudaModel::forward_blocks(int64_t N, int64_t M, int64_t seqs) {
  Impl& m = *m_;
  const int64_t H = c_.hidden, V = c_.vocab;
  const int heads = static_cast<int>(c_.heads), kv_heads = static_cast<int>(c_.kv_heads), hd = static_cast<int>(c_.head_dim);
  const bool fp8 = kv_ == KvDtype::kFp8;
  const int32_t* positions = m.m<int32_t>(m.at_positions);
  const int32_t* local = m.m<int32_t>(m.at_local);
  const cudaStream_t st = m.stream;
  // The query blocks [anchor, MASK × K] of every drafting sequence, back to back.
  KILN_RETURN_IF_ERROR(s_.embed(m.m<int32_t>(m.at_ids), N, TensorView::contiguous(m.emb, DType::kBF16, {N, H}, m.device)));
  KILN_RETURN_IF_ERROR(cuda_ok(cuda::embed_to_residual(m.emb, N * H, static_cast<float>(c_.input_embedding_scale), m.h, st),
                               "embedding"));
  const cuda::BlockRows meta{positions, local, m.m<int32_t>(m.at_block_start), m.m<int32_t>(m.at_block_len),
                             m.m<int32_t>(m.at_seq), m.m<int32_t>(m.at_tables), m.m<int32_t>(m.at_table_offset),
                             s_.block_size()};
  const int T = static_cast<int>(c_.conv_taps);
  for (int64_t li = 0; li < c_.layers; ++li) {
    const LayerLinears& l = m.layers[li];
    const LayerAttention& att = c_.attention[li];
    // Attention sublayer (v2: inside the dynamic conv).
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::rms_norm(m.h, nullptr, l.input_norm, N, H, c_.rms_eps, c_.v2 ? m.x : nullptr,
                                                m.xb, st), "input_layernorm"));
    if (c_.v2) {
      KILN_RETURN_IF_ERROR(m.linear(*l.attention_conv, m.xb, N, m.conv_d, DType::kF32));
      KILN_RETURN_IF_ERROR(cuda_ok(cuda::dynamic_conv(m.x, m.conv_d, l.attention_base, local, N, H, T, c_.conv_group, 0,
                                                      m.xb, nullptr, st), "attention conv"));
    }
    KILN_RETURN_IF_ERROR(m.linear(*l.qkv, m.xb, N, m.qkv, DType::kF32));
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::norm_rope_qk(m.qkv, l.q_norm, l.k_norm, positions, N, heads, kv_heads, hd,
                                                    c_.rms_eps, c_.rope_theta, st), "q/k norms"));
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::block_attention(m.qkv, N, meta, heads, kv_heads, hd, m.k_cache[li], m.v_cache[li],
                                                       fp8, att.window, att.causal, m.attn, st), "block attention"));
    if (c_.v2) {
      KILN_RETURN_IF_ERROR(m.linear(*l.o, m.attn, N, m.y, DType::kF32));
      KILN_RETURN_IF_ERROR(cuda_ok(cuda::dynamic_conv(m.y, m.conv_d, l.attention_base, local, N, H, T, c_.conv_group, 1,
                                                      nullptr, m.h, st), "attention conv"));
    } else {
      KILN_RETURN_IF_ERROR(m.linear(*l.o, m.attn, N, m.h, DType::kF32, true));
    }
    // MLP sublayer (SwiGLU), likewise.
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::rms_norm(m.h, nullptr, l.post_norm, N, H, c_.rms_eps, c_.v2 ? m.x : nullptr,
                                                m.xb, st), "post_attention_layernorm"));
    if (c_.v2) {
      KILN_RETURN_IF_ERROR(m.linear(*l.mlp_conv, m.xb, N, m.conv_d, DType::kF32));
      KILN_RETURN_IF_ERROR(cuda_ok(cuda::dynamic_conv(m.x, m.conv_d, l.mlp_base, local, N, H, T, c_.conv_group, 0, m.xb,
                                                      nullptr, st), "mlp conv"));
    }
    KILN_RETURN_IF_ERROR(m.linear(*l.gate_up, m.xb, N, m.gu, DType::kF32));
    KILN_RETURN_IF_ERROR(cuda_ok(cuda::swiglu(m.gu, N, c_.intermediate, m.act, st), "SwiGLU"));
    if (c_.v2) {
      KILN_RETURN_IF_ERROR(m.linear(*l.down, m.act, N, m.y, DType::kF32));
      KILN_RETURN_IF_ERROR(cuda_ok(cuda::dynamic_conv(m.y, m.conv_d, l.mlp_base, local, N, H, T, c_.conv_group, 1,
                                                      nullptr, m.h, st), "mlp conv"));
    } else {
      KILN_RETURN_IF_ERROR(m.linear(*l.down, m.act, N, m.h, DType::kF32, true));
    }
  }
  // Rows 1..K of each block, normed, through the target's lm_head: they predict the tokens at their own positions.
  KILN_RETURN_IF_ERROR(cuda_ok(cuda::rms_norm(m.h, m.m<int32_t>(m.at_draft_src), m.norm, M, H, c_.rms_eps, nullptr,
                                              m.normed, st), "final norm"));
  KILN_RETURN_IF_ERROR(s_.lm_head(TensorView::contiguous(m.normed, DType::kBF16, {M, H}, m.device), logits_));
  if (c_.v2) KILN_RETURN_IF_ERROR(m.linear(*m.selector, m.normed, M, m.g, DType::kF32));
  const int k = static_cast<int>(walk_width_);
  KILN_RETURN_IF_ERROR(cuda_ok(cuda::top_k(logits_, M, V, k, c_.output_multiplier, c_.softcap, m.cand_ids,
                                           m.cand_values, st), "top-k"));
  cuda::WalkArgs w{};
  w.cand_ids = m.cand_ids;
  w.cand_values = m.cand_values;
  w.k = k;
  w.g = c_.v2 ? m.g : nullptr;
  w.predecessor = m.predecessor;
  w.successor = m.successor;
  w.rank = c_.selector_rank;
  w.first_row = m.m<int32_t>(m.at_first_row);
  w.depth = m.m<int32_t>(m.at_depth);
  w.anchor = m.m<int32_t>(m.at_anchor);
  w.temperature = m.m<float>(m.at_temperature);
  w.uniforms = m.m<double>(m.at_uniforms);
  w.tokens = tokens_;
  w.q_ids = q_ids_;
  w.q_probs = q_probs_;
  return cuda_ok(cuda::draft_walk(w, seqs, st), "draft walk");
}

}  // namespace kiln::dflash
