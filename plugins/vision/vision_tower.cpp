#include "vision_tower.h"

#include <cmath>
#include <string>

#include "vision_ops.h"

namespace kiln::vision {

// The processor lists patches block by block (row-block, column-block, then inner row, inner column), so
// consecutive merge² rows form one merge block.
void patch_positions(std::span<const std::array<int64_t, 3>> grids, int64_t m, std::vector<int64_t>& rows,
                     std::vector<int64_t>& cols, std::vector<int64_t>& segments) {
  for (const auto& [t, h, w] : grids)
    for (int64_t f = 0; f < t; ++f) {
      segments.push_back(h * w);
      for (int64_t by = 0; by < h / m; ++by)
        for (int64_t bx = 0; bx < w / m; ++bx)
          for (int64_t iy = 0; iy < m; ++iy)
            for (int64_t ix = 0; ix < m; ++ix) rows.push_back(by * m + iy), cols.push_back(bx * m + ix);
    }
}

// cos / sin [n, head_dim]: quarter q of the head holds the row angles, the next quarter the column angles, and the
// second half repeats the first (rotate-half pairs channel i with i + head_dim/2). fp32 as the reference computes.
void axial_rope_tables(const VisionConfig& c, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                       std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const int64_t hd = c.head_dim(), q = hd / 4, spatial = hd / 2;
  std::vector<float> inv_freq(static_cast<size_t>(q));
  for (int64_t k = 0; k < q; ++k)
    inv_freq[k] =
        1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * k) / static_cast<float>(spatial));
  const int64_t n = static_cast<int64_t>(rows.size());
  cos_t.resize(static_cast<size_t>(n * hd));
  sin_t.resize(static_cast<size_t>(n * hd));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < q; ++k) {
      const float a_row = static_cast<float>(rows[i]) * inv_freq[k], a_col = static_cast<float>(cols[i]) * inv_freq[k];
      for (int64_t half : {int64_t{0}, spatial}) {
        cos_t[i * hd + half + k] = std::cos(a_row), sin_t[i * hd + half + k] = std::sin(a_row);
        cos_t[i * hd + half + q + k] = std::cos(a_col), sin_t[i * hd + half + q + k] = std::sin(a_col);
      }
    }
}

namespace {

// In place on one head's row x[hd]: x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁].
void rotate(float* x, const float* cos_r, const float* sin_r, int64_t hd) {
  const int64_t half = hd / 2;
  float tmp[512];
  for (int64_t i = 0; i < hd; ++i) tmp[i] = x[i];
  for (int64_t i = 0; i < hd; ++i) {
    const float r = i < half ? -tmp[i + half] : tmp[i - half];
    x[i] = tmp[i] * cos_r[i] + r * sin_r[i];
  }
}

const float* bias(const std::vector<float>& b) {
  return b.empty() ? nullptr : b.data();
}

void block_forward(const VisionConfig& c, const VisionBlockWeights& w, std::vector<float>& x,
                   const std::vector<int64_t>& segments, const std::vector<float>& cos_t,
                   const std::vector<float>& sin_t) {
  const int64_t n = static_cast<int64_t>(x.size()) / c.hidden_size, h = c.hidden_size, hd = c.head_dim();
  const int64_t heads = c.num_heads;
  std::vector<float> t(x);
  rms_norm(t.data(), n, h, w.norm1.data(), c.rms_norm_eps);
  std::vector<float> qkv(static_cast<size_t>(n * 3 * h));
  linear(t.data(), n, h, w.qkv_w.data(), bias(w.qkv_b), 3 * h, qkv.data());
  // Row layout (3, heads, hd): q at 0, k at h, v at 2h; per-head RMSNorm and RoPE on q and k.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t head = 0; head < heads; ++head) {
        float* v = qkv.data() + i * 3 * h + part * h + head * hd;
        rms_norm(v, 1, hd, part == 0 ? w.q_norm.data() : w.k_norm.data(), c.rms_norm_eps);
        rotate(v, cos_t.data() + i * hd, sin_t.data() + i * hd, hd);
      }
  std::vector<float> attn(static_cast<size_t>(n * h));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int64_t start = 0;
  for (int64_t len : segments) {
    for (int64_t head = 0; head < heads; ++head) {
      const float* base = qkv.data() + start * 3 * h + head * hd;
      // attend_segment reads q, k, v rows with one stride; the output has another, so it goes through a buffer.
      std::vector<float> o(static_cast<size_t>(len * 3 * h));
      attend_segment(base, base + h, base + 2 * h, o.data(), len, hd, 3 * h, scale);
      for (int64_t i = 0; i < len; ++i)
        for (int64_t d = 0; d < hd; ++d) attn[(start + i) * h + head * hd + d] = o[i * 3 * h + d];
    }
    start += len;
  }
  linear(attn.data(), n, h, w.proj_w.data(), bias(w.proj_b), h, t.data());
  for (size_t i = 0; i < x.size(); ++i) x[i] += t[i];

  t = x;
  rms_norm(t.data(), n, h, w.norm2.data(), c.rms_norm_eps);
  const int64_t inter = c.intermediate_size;
  std::vector<float> gate(static_cast<size_t>(n * inter)), up(static_cast<size_t>(n * inter));
  linear(t.data(), n, h, w.gate_w.data(), bias(w.gate_b), inter, gate.data());
  linear(t.data(), n, h, w.up_w.data(), bias(w.up_b), inter, up.data());
  clamped_swiglu(gate.data(), up.data(), n * inter, c.swiglu_limit);
  linear(gate.data(), n, inter, w.down_w.data(), bias(w.down_b), h, t.data());
  for (size_t i = 0; i < x.size(); ++i) x[i] += t[i];
}

}  // namespace

Result<int64_t> check_tower_input(const VisionConfig& c, size_t pixel_values,
                                  std::span<const std::array<int64_t, 3>> grids) {
  const int64_t m = c.spatial_merge_size;
  if (c.head_dim() > 512) return unimplemented("vision heads wider than 512 channels");
  int64_t n = 0;
  for (const auto& [t, h, wd] : grids) {
    if (t <= 0 || h <= 0 || wd <= 0 || h % m != 0 || wd % m != 0)
      return invalid_argument("image grid (" + std::to_string(t) + ", " + std::to_string(h) + ", " +
                              std::to_string(wd) + ") is empty or not a whole number of " + std::to_string(m) + "×" +
                              std::to_string(m) + " merge blocks");
    n += t * h * wd;
  }
  if (static_cast<int64_t>(pixel_values) != n * c.patch_dim())
    return invalid_argument("pixel_values hold " + std::to_string(pixel_values) + " values; the grids need " +
                            std::to_string(n) + " patches of " + std::to_string(c.patch_dim()));
  return n;
}

Result<std::vector<float>> run_vision_tower(const VisionConfig& c, const VisionWeights& w,
                                            std::span<const float> pixel_values,
                                            std::span<const std::array<int64_t, 3>> grids) {
  const int64_t m = c.spatial_merge_size;
  KILN_ASSIGN_OR_RETURN(const int64_t n, check_tower_input(c, pixel_values.size(), grids));
  std::vector<int64_t> rows, cols, segments;
  patch_positions(grids, m, rows, cols, segments);
  std::vector<float> cos_t, sin_t;
  axial_rope_tables(c, rows, cols, cos_t, sin_t);

  const int64_t h = c.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * h));
  linear(pixel_values.data(), n, c.patch_dim(), w.patch_w.data(), w.patch_b.data(), h, x.data());
  for (const VisionBlockWeights& block : w.blocks) block_forward(c, block, x, segments, cos_t, sin_t);
  rms_norm(x.data(), n, h, w.post_norm.data(), c.rms_norm_eps);

  // Downsample: each merge block's m² consecutive rows, concatenated, through the reordered Conv2d.
  const int64_t tokens = n / (m * m), out = c.out_hidden_size, pi = c.projection_intermediate_size;
  std::vector<float> y(static_cast<size_t>(tokens * out));
  linear(x.data(), tokens, m * m * h, w.down_w.data(), w.down_b.data(), out, y.data());

  // Merger: proj → LayerNorm → GELU → clamped SwiGLU.
  std::vector<float> z(y.size());
  linear(y.data(), tokens, out, w.merger_proj.data(), nullptr, out, z.data());
  layer_norm(z.data(), tokens, out, w.merger_norm_w.data(), w.merger_norm_b.data(), 1e-5);
  gelu(z.data(), tokens * out);
  std::vector<float> gate(static_cast<size_t>(tokens * pi)), up(static_cast<size_t>(tokens * pi));
  linear(z.data(), tokens, out, w.merger_gate.data(), nullptr, pi, gate.data());
  linear(z.data(), tokens, out, w.merger_up.data(), nullptr, pi, up.data());
  clamped_swiglu(gate.data(), up.data(), tokens * pi, c.swiglu_limit);
  linear(gate.data(), tokens, pi, w.merger_down.data(), nullptr, out, y.data());
  return y;
}

}  // namespace kiln::vision
