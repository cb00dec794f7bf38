#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln::cpu {
namespace {

// torch's fp32 pow/cos/sin are accurate to about an ulp; computing in fp64 and rounding once gives the
// correctly rounded fp32 value, which is what those kernels return for these well-conditioned inputs.
float pow_f32(float base, float exponent) {
  return static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_factor(const RopeConfig& c) {
  if (c.factor) return *c.factor;
  return static_cast<double>(c.max_position_embeddings) / static_cast<double>(c.original_max_position_embeddings);
}

// HF's find_correction_dim: the dimension at which `rotations` full turns fit in the original context.
double correction_dim(double rotations, double dim, double base, double original_max) {
  return (dim * std::log(original_max / (rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(base));
}

// _compute_llama3_parameters: wavelengths shorter than original/high_freq_factor keep their frequency, longer than
// original/low_freq_factor divide it by factor, and the band between blends the two. Each step mirrors torch's fp32
// tensor-with-Python-scalar arithmetic (the scalar rounded to fp32 first) so the table matches bit for bit.
void llama3_rescale(const RopeConfig& c, std::vector<float>& inv_freq) {
  const auto factor = static_cast<float>(*c.factor);
  const auto original = static_cast<double>(c.original_max_position_embeddings);
  const auto low_freq_wavelen = static_cast<float>(original / c.low_freq_factor);
  const auto high_freq_wavelen = static_cast<float>(original / c.high_freq_factor);
  const auto two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const auto original_f = static_cast<float>(original);
  const auto low_f = static_cast<float>(c.low_freq_factor);
  const auto band = static_cast<float>(c.high_freq_factor - c.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = two_pi / f;
    const float kept_or_divided = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = (original_f / wavelen - low_f) / band;
    const float smoothed = (1.0f - smooth) * kept_or_divided / factor + smooth * kept_or_divided;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : kept_or_divided;
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& c) {
  const int64_t half = c.rotary_dim / 2;
  const auto base = static_cast<float>(c.theta);
  const auto dim_f = static_cast<float>(c.rotary_dim);
  // pos_freqs = base ** (arange(0, dim, 2, float32) / dim), all fp32.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) pos_freqs[i] = pow_f32(base, static_cast<float>(2 * i) / dim_f);

  std::vector<float> inv_freq(static_cast<size_t>(half));
  if (c.scaling != RopeConfig::Scaling::kYarn) {
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0f / pos_freqs[i];
    // _compute_linear_scaling_rope_parameters: inv_freq /= factor, in fp32.
    if (c.scaling == RopeConfig::Scaling::kLinear) {
      for (float& f : inv_freq) f /= static_cast<float>(*c.factor);
    }
    if (c.scaling == RopeConfig::Scaling::kLlama3) llama3_rescale(c, inv_freq);
    return inv_freq;
  }

  const double factor = yarn_factor(c);
  const double beta_fast = c.beta_fast.value_or(0.0) != 0.0 ? *c.beta_fast : 32.0;
  const double beta_slow = c.beta_slow.value_or(0.0) != 0.0 ? *c.beta_slow : 1.0;
  const auto original_max = static_cast<double>(c.original_max_position_embeddings);
  double low = correction_dim(beta_fast, static_cast<double>(c.rotary_dim), c.theta, original_max);
  double high = correction_dim(beta_slow, static_cast<double>(c.rotary_dim), c.theta, original_max);
  if (c.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(c.rotary_dim - 1));
  if (low == high) high += 0.001;  // HF: prevents a division by zero in the ramp

  // HF's tensor-with-Python-scalar arithmetic runs in fp32 with the scalar rounded to fp32; mirror it
  // operation by operation so inv_freq matches bit for bit.
  const auto low_f = static_cast<float>(low);
  const auto span_f = static_cast<float>(high - low);
  const auto factor_f = static_cast<float>(factor);
  for (int64_t i = 0; i < half; ++i) {
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (factor_f * pos_freqs[i]);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float interpolated_part = interpolation * (1.0f - extrapolation_factor);
    const float extrapolated_part = extrapolation * extrapolation_factor;
    inv_freq[i] = interpolated_part + extrapolated_part;
  }
  return inv_freq;
}

double rope_attention_factor(const RopeConfig& c) {
  if (c.scaling != RopeConfig::Scaling::kYarn) return 1.0;
  if (c.attention_factor) return *c.attention_factor;
  const double factor = yarn_factor(c);
  const double mscale = c.mscale.value_or(0.0);
  const double mscale_all_dim = c.mscale_all_dim.value_or(0.0);
  if (mscale != 0.0 && mscale_all_dim != 0.0)
    return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim);
  return yarn_get_mscale(factor, 1.0);
}

double yarn_attention_scale(const RopeConfig& c, double base_scale) {
  if (c.scaling == RopeConfig::Scaling::kNone) return base_scale;
  const double mscale_all_dim = c.mscale_all_dim.value_or(0.0);
  if (mscale_all_dim == 0.0) return base_scale;
  // HF reads rope_parameters["factor"] here directly.
  const double m = yarn_get_mscale(yarn_factor(c), mscale_all_dim);
  return base_scale * m * m;
}

void rope_cos_sin(const float* inv_freq, int64_t half, double attention_factor, const int64_t* positions, int64_t n,
                  float* cos, float* sin) {
  const auto scale = static_cast<float>(attention_factor);
#pragma omp parallel for schedule(static) if (n * half >= (1 << 14))
  for (int64_t t = 0; t < n; ++t) {
    const auto position = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position * inv_freq[i]);
      cos[t * half + i] = static_cast<float>(std::cos(angle)) * scale;
      sin[t * half + i] = static_cast<float>(std::sin(angle)) * scale;
    }
  }
}

void apply_rope_interleaved(float* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                            const float* cos, const float* sin, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
#pragma omp parallel for schedule(static) if (n * num_heads * rotary_dim >= (1 << 15))
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    std::vector<float> pairs(static_cast<size_t>(rotary_dim));
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + t * token_stride + h * head_stride;
      std::copy(v, v + rotary_dim, pairs.begin());
      for (int64_t i = 0; i < half; ++i) {
        const float even = pairs[2 * i];
        const float odd = pairs[2 * i + 1];
        v[i] = even * c[i] - odd * s[i];
        v[half + i] = odd * c[i] + even * s[i];
      }
    }
  }
}

void apply_rope_half_split(float* x, int64_t n, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                           const float* cos, const float* sin, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
#pragma omp parallel for schedule(static) if (n * num_heads * rotary_dim >= (1 << 15))
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + t * token_stride + h * head_stride;
      for (int64_t i = 0; i < half; ++i) {
        const float first = v[i];
        const float second = v[half + i];
        v[i] = first * c[i] - second * s[i];
        v[half + i] = second * c[i] + first * s[i];
      }
    }
  }
}

}  // namespace kiln::cpu
