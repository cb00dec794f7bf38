#include "dflash_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace kiln::dflash {
namespace {

// Vectorised (-fopenmp-simd): the sum's order is fixed by the build, not by the data, so results are reproducible.
float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// y[n, W.rows] = x[n, W.cols] · Wᵀ
void linear(const float* x, int64_t n, const Matrix& W, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * W.cols;
    for (int64_t o = 0; o < W.rows; ++o) {
      const float* wo = W.w.data() + o * W.cols;
      y[i * W.rows + o] = dot(xi, wo, W.cols);
    }
  }
}

void rms_norm(const float* x, const float* w, int64_t n, int64_t d, double eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0.0;
    for (int64_t c = 0; c < d; ++c) ss += double(x[i * d + c]) * x[i * d + c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int64_t c = 0; c < d; ++c) y[i * d + c] = x[i * d + c] * r * w[c];
  }
}

// NeoX rotate-half RoPE on `heads` heads of width hd at `position`.
void rope(float* x, int64_t heads, int64_t hd, int64_t position, double theta) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv = std::pow(theta, -2.0 * double(i) / double(hd));
    const double a = double(position) * inv;
    const float cs = static_cast<float>(std::cos(a)), sn = static_cast<float>(std::sin(a));
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + h * hd;
      const float x1 = p[i], x2 = p[i + half];
      p[i] = x1 * cs - x2 * sn;
      p[i + half] = x2 * cs + x1 * sn;
    }
  }
}

uint16_t float_to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7FFF + ((b >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>(b >> 16);
}

float bf16_to_float(uint16_t v) {
  const uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// float8 e4m3 (OCP E4M3FN): round to nearest even, saturating at ±448 (no scale: the drafter's keys are
// RMS-normed and its values small, as in the published fp8 draft caches).
uint8_t float_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  const float a = std::fabs(x);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7E);
  if (a < 0.015625f) return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  int e = 0;
  const float frac = std::frexp(a, &e);
  int m = static_cast<int>(std::nearbyint((frac * 2.0f - 1.0f) * 8.0f));
  int exponent = e - 1 + 7;
  if (m == 8) m = 0, ++exponent;
  if (exponent > 15 || (exponent == 15 && m == 7)) return static_cast<uint8_t>(sign | 0x7E);
  return static_cast<uint8_t>(sign | (exponent << 3) | m);
}

float e4m3_to_float(uint8_t v) {
  const int exponent = (v >> 3) & 0xF, m = v & 0x7;
  float a;
  if (exponent == 0xF && m == 0x7) a = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0) a = std::ldexp(static_cast<float>(m), -9);
  else a = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, exponent - 7);
  return (v & 0x80) ? -a : a;
}

// Indices of the k largest values, largest first, ties to the lower index.
std::vector<int32_t> top_k(const float* x, int64_t n, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// softmax(x / T) in place over n entries.
void softmax(float* x, int64_t n, float temperature) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp((x[i] - mx) / temperature));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] / sum);
}

int64_t draw(const float* p, int64_t n, double u) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return i;
  }
  for (int64_t i = n - 1; i >= 0; --i)
    if (p[i] > 0) return i;  // u past the rounded total: the last candidate with mass
  return 0;
}

}  // namespace

DflashModel::DflashModel(DflashConfig config, DflashWeights weights, int64_t target_hidden, KvDtype kv)
    : c_(std::move(config)), w_(std::move(weights)), target_hidden_(target_hidden), kv_(kv) {}

size_t DflashModel::kv_row_bytes() const {
  return static_cast<size_t>(c_.kv_heads * c_.head_dim) * (kv_ == KvDtype::kBf16 ? 2 : 1);
}

int64_t DflashModel::q_width() const { return c_.v2 ? c_.selector_top_k : std::min<int64_t>(64, c_.vocab); }

uint8_t* DflashModel::row(const SequenceCache& cache, const std::vector<uint8_t*>& base, int64_t layer,
                          int64_t position) const {
  const int64_t page = cache.block_table[position / cache.block_size];
  return base[layer] + (page * cache.block_size + position % cache.block_size) * kv_row_bytes();
}

void DflashModel::encode(const float* x, uint8_t* dst) const {
  const int64_t n = c_.kv_heads * c_.head_dim;
  if (kv_ == KvDtype::kBf16) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = float_to_bf16(x[i]);
      std::memcpy(dst + 2 * i, &b, 2);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_e4m3(x[i]);
  }
}

void DflashModel::decode(const uint8_t* src, float* x) const {
  const int64_t n = c_.kv_heads * c_.head_dim;
  if (kv_ == KvDtype::kBf16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      x[i] = bf16_to_float(b);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] = e4m3_to_float(src[i]);
  }
}

// k = RoPE(k_norm(k_proj x)) at `position`, per KV head.
void DflashModel::project_key(const LayerWeights& l, const float* x, int64_t position, float* k) const {
  linear(x, 1, l.k, k);
  rms_norm(k, l.k_norm.data(), c_.kv_heads, c_.head_dim, c_.rms_eps, k);
  rope(k, c_.kv_heads, c_.head_dim, position, c_.rope_theta);
}

Status DflashModel::append_context(const std::vector<const float*>& taps, int64_t tap_stride, int64_t n, int64_t start,
                                   const SequenceCache& cache) {
  const int64_t H = c_.hidden, nt = static_cast<int64_t>(taps.size()), kvw = c_.kv_heads * c_.head_dim;
  if (cache.num_blocks * cache.block_size < start + n)
    return invalid_argument("dflash drafter: the block table covers " + std::to_string(cache.num_blocks * cache.block_size) +
                            " positions, the context needs " + std::to_string(start + n));
  feat_.resize(static_cast<size_t>(nt * target_hidden_));
  ctx_.resize(static_cast<size_t>(H));
  k_.resize(static_cast<size_t>(kvw));
  v_.resize(static_cast<size_t>(kvw));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < nt; ++t)
      std::memcpy(feat_.data() + t * target_hidden_, taps[t] + i * tap_stride, static_cast<size_t>(target_hidden_) * 4);
    linear(feat_.data(), 1, w_.fc, ctx_.data());
    rms_norm(ctx_.data(), w_.hidden_norm.data(), 1, H, c_.rms_eps, ctx_.data());
    for (int64_t l = 0; l < c_.layers; ++l) {
      project_key(w_.layers[l], ctx_.data(), start + i, k_.data());
      linear(ctx_.data(), 1, w_.layers[l].v, v_.data());
      encode(k_.data(), row(cache, cache.k, l, start + i));
      encode(v_.data(), row(cache, cache.v, l, start + i));
    }
  }
  return ok_status();
}

// out[t, c] = Σ_o (base[side][o][c] + D[t][side][o][c / group]) · x[t − o][c], zero before the block start.
void DflashModel::conv(const DynamicConvWeights& w, int side, const float* d, const float* x, int64_t n, float* y) const {
  const int64_t H = c_.hidden, T = c_.conv_taps, G = H / c_.conv_group, gs = c_.conv_group;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t ch = 0; ch < H; ++ch) {
      float s = 0.0f;
      for (int64_t o = 0; o < T && o <= t; ++o) {
        const float coef = w.base.w[(side * T + o) * H + ch] + d[t * 2 * T * G + (side * T + o) * G + ch / gs];
        s += coef * x[(t - o) * H + ch];
      }
      y[t * H + ch] = s;
    }
}

void DflashModel::layer_forward(int64_t li, float* h, int64_t n, int64_t anchor_position, const SequenceCache& cache) {
  const LayerWeights& l = w_.layers[li];
  const LayerAttention& att = c_.attention[li];
  const int64_t H = c_.hidden, hd = c_.head_dim, nh = c_.heads, nkv = c_.kv_heads, kvw = nkv * hd, I = c_.intermediate;
  const int64_t convw = c_.v2 ? 2 * c_.conv_taps * (H / c_.conv_group) : 0;
  x_.resize(static_cast<size_t>(n * H));
  y_.resize(static_cast<size_t>(n * H));
  d_.resize(static_cast<size_t>(n * convw));
  q_.resize(static_cast<size_t>(n * nh * hd));
  k_.resize(static_cast<size_t>(n * kvw));
  v_.resize(static_cast<size_t>(n * kvw));
  attn_.resize(static_cast<size_t>(n * nh * hd));

  // Attention sublayer (wrapped in the dynamic conv for v2).
  rms_norm(h, l.input_norm.data(), n, H, c_.rms_eps, x_.data());
  if (c_.v2) {
    linear(x_.data(), n, l.attention_conv.projection, d_.data());
    conv(l.attention_conv, 0, d_.data(), x_.data(), n, y_.data());
    std::swap(x_, y_);
  }
  linear(x_.data(), n, l.q, q_.data());
  linear(x_.data(), n, l.k, k_.data());
  linear(x_.data(), n, l.v, v_.data());
  for (int64_t i = 0; i < n; ++i) {
    rms_norm(q_.data() + i * nh * hd, l.q_norm.data(), nh, hd, c_.rms_eps, q_.data() + i * nh * hd);
    rms_norm(k_.data() + i * kvw, l.k_norm.data(), nkv, hd, c_.rms_eps, k_.data() + i * kvw);
    rope(q_.data() + i * nh * hd, nh, hd, anchor_position + i, c_.rope_theta);
    rope(k_.data() + i * kvw, nkv, hd, anchor_position + i, c_.rope_theta);
  }
  // Context keys any block query can see: positions > anchor − window (all of them without a window).
  const int64_t lo = att.window > 0 ? std::max<int64_t>(0, anchor_position - att.window + 1) : 0;
  const int64_t nctx = anchor_position - lo;
  ctx_k_.resize(static_cast<size_t>(nctx * kvw));
  ctx_v_.resize(static_cast<size_t>(nctx * kvw));
  for (int64_t p = lo; p < anchor_position; ++p) {
    decode(row(cache, cache.k, li, p), ctx_k_.data() + (p - lo) * kvw);
    decode(row(cache, cache.v, li, p), ctx_v_.data() + (p - lo) * kvw);
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  scores_.resize(static_cast<size_t>(nctx + n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t P = anchor_position + i;
    for (int64_t hh = 0; hh < nh; ++hh) {
      const int64_t g = hh / (nh / nkv);
      const float* qv = q_.data() + (i * nh + hh) * hd;
      float mx = -std::numeric_limits<float>::infinity();
      auto visible = [&](int64_t pos, bool in_block, int64_t j) {
        if (att.window > 0 && std::llabs(P - pos) >= att.window) return false;
        return !in_block || !att.causal || j <= i;
      };
      for (int64_t j = 0; j < nctx + n; ++j) {
        const bool in_block = j >= nctx;
        const int64_t pos = in_block ? anchor_position + (j - nctx) : lo + j;
        if (!visible(pos, in_block, j - nctx)) {
          scores_[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* kv = in_block ? k_.data() + (j - nctx) * kvw + g * hd : ctx_k_.data() + j * kvw + g * hd;
        scores_[j] = dot(qv, kv, hd) * scale;
        mx = std::max(mx, scores_[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < nctx + n; ++j) sum += (scores_[j] = std::isinf(scores_[j]) ? 0.0f : std::exp(scores_[j] - mx));
      float* out = attn_.data() + (i * nh + hh) * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t j = 0; j < nctx + n; ++j) {
        if (scores_[j] == 0.0f) continue;
        const float p = static_cast<float>(scores_[j] / sum);
        const float* vv = j >= nctx ? v_.data() + (j - nctx) * kvw + g * hd : ctx_v_.data() + j * kvw + g * hd;
        for (int64_t e = 0; e < hd; ++e) out[e] += p * vv[e];
      }
    }
  }
  linear(attn_.data(), n, l.o, y_.data());
  if (c_.v2) {
    conv(l.attention_conv, 1, d_.data(), y_.data(), n, x_.data());
    std::swap(x_, y_);
  }
  for (int64_t i = 0; i < n * H; ++i) h[i] += y_[i];

  // MLP sublayer (SwiGLU), likewise wrapped.
  rms_norm(h, l.post_norm.data(), n, H, c_.rms_eps, x_.data());
  if (c_.v2) {
    linear(x_.data(), n, l.mlp_conv.projection, d_.data());
    conv(l.mlp_conv, 0, d_.data(), x_.data(), n, y_.data());
    std::swap(x_, y_);
  }
  gate_.resize(static_cast<size_t>(n * I));
  up_.resize(static_cast<size_t>(n * I));
  linear(x_.data(), n, l.gate, gate_.data());
  linear(x_.data(), n, l.up, up_.data());
  for (int64_t i = 0; i < n * I; ++i) gate_[i] = gate_[i] / (1.0f + std::exp(-gate_[i])) * up_[i];
  linear(gate_.data(), n, l.down, y_.data());
  if (c_.v2) {
    conv(l.mlp_conv, 1, d_.data(), y_.data(), n, x_.data());
    std::swap(x_, y_);
  }
  for (int64_t i = 0; i < n * H; ++i) h[i] += y_[i];
}

Status DflashModel::draft(int32_t anchor, int64_t anchor_position, int k, float temperature, std::mt19937_64& rng,
                          const SequenceCache& cache, TargetHead& target, BlockDrafts& out) {
  const int64_t H = c_.hidden, V = c_.vocab, n = 1 + k;
  if (k < 1 || k > c_.block_size - 1)
    return invalid_argument("dflash drafter: " + std::to_string(k) + " drafts asked, the block holds at most " +
                            std::to_string(c_.block_size - 1));
  // The query block [anchor, MASK × K] at positions anchor_position .. + K.
  std::vector<int32_t> ids(static_cast<size_t>(n), c_.mask_token);
  ids[0] = anchor;
  std::vector<float> h(static_cast<size_t>(n * H));
  KILN_RETURN_IF_ERROR(target.embed(ids.data(), n, h.data()));
  if (c_.input_embedding_scale != 1.0)
    for (float& x : h) x *= static_cast<float>(c_.input_embedding_scale);
  for (int64_t l = 0; l < c_.layers; ++l) layer_forward(l, h.data(), n, anchor_position, cache);
  normed_.resize(static_cast<size_t>(n * H));
  rms_norm(h.data(), w_.norm.data(), n, H, c_.rms_eps, normed_.data());
  // Rows 1..K predict the tokens at their own positions.
  logits_.resize(static_cast<size_t>(k * V));
  KILN_RETURN_IF_ERROR(target.lm_head(normed_.data() + H, k, logits_.data()));
  for (float& x : logits_) {
    x *= static_cast<float>(c_.output_multiplier);
    if (c_.softcap > 0) x = static_cast<float>(std::tanh(x / c_.softcap) * c_.softcap);
  }

  const bool sampled = temperature > 0;
  const int64_t width = q_width();
  out.tokens.assign(static_cast<size_t>(k), 0);
  out.q_width = sampled ? width : 0;
  out.q_ids.assign(sampled ? static_cast<size_t>(k * width) : 0, -1);
  out.q_probs.assign(sampled ? static_cast<size_t>(k * width) : 0, 0.0f);
  std::vector<float> row(static_cast<size_t>(width)), g(static_cast<size_t>(c_.selector_rank)), ag(g.size());
  int32_t prev = anchor;
  for (int64_t t = 0; t < k; ++t) {
    const float* lg = logits_.data() + t * V;
    if (!c_.v2 && !sampled) {  // v1 greedy: argmax, ties to the lowest id
      out.tokens[t] = static_cast<int32_t>(std::max_element(lg, lg + V) - lg);
      continue;
    }
    const std::vector<int32_t> cand = top_k(lg, V, width);
    for (int64_t j = 0; j < width; ++j) row[j] = lg[cand[j]];
    if (c_.v2) {  // S_t(prev, b) = U_t(b) + Σ_r A[prev, r] · g_t[r] · B[b, r]
      linear(normed_.data() + (1 + t) * H, 1, w_.selector_projection, g.data());
      const float* a = w_.predecessor.w.data() + static_cast<int64_t>(prev) * c_.selector_rank;
      for (int64_t r = 0; r < c_.selector_rank; ++r) ag[r] = a[r] * g[r];
      for (int64_t j = 0; j < width; ++j) {
        const float* b = w_.successor.w.data() + static_cast<int64_t>(cand[j]) * c_.selector_rank;
        row[j] += dot(ag.data(), b, c_.selector_rank);
      }
    }
    int64_t pick = 0;
    if (!sampled) {
      pick = std::max_element(row.begin(), row.end()) - row.begin();  // first maximum: ties to the lowest index
    } else {
      softmax(row.data(), width, temperature);
      pick = draw(row.data(), width, uniform(rng));
      std::copy(cand.begin(), cand.end(), out.q_ids.begin() + t * width);
      std::copy(row.begin(), row.end(), out.q_probs.begin() + t * width);
    }
    out.tokens[t] = prev = cand[pick];
  }
  return ok_status();
}

}  // namespace kiln::dflash
