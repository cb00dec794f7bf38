#include "bicubic_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::vision {
namespace {

// Keys' cubic convolution kernel with a = −0.5 (Pillow's and ATen's antialiased bicubic), each piece evaluated
// in the reference's operation order: the weights are quantised, so a different rounding could move one.
double cubic_filter(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// One axis: for every output index the first input index, the tap count and `taps` int16 weights.
struct AxisWeights {
  int64_t taps = 0;
  int precision = 0;
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  std::vector<int16_t> weights;  // out_size * taps
};

AxisWeights axis_weights(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double inverse_scale = scale >= 1.0 ? 1.0 / scale : 1.0;
  AxisWeights axis;
  axis.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  axis.first.resize(static_cast<size_t>(out_size));
  axis.count.resize(static_cast<size_t>(out_size));
  std::vector<double> real(static_cast<size_t>(out_size * axis.taps), 0.0);
  double largest = 0.0;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    // Truncation toward zero, as the reference's integer casts (then clamped).
    const int64_t first = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    const int64_t count =
        std::clamp(std::min(static_cast<int64_t>(center + support + 0.5), in_size) - first, int64_t{0}, axis.taps);
    double* w = &real[static_cast<size_t>(i * axis.taps)];
    double total = 0.0;
    for (int64_t j = 0; j < count; ++j) {
      w[j] = cubic_filter((static_cast<double>(j + first) - center + 0.5) * inverse_scale);
      total += w[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < count; ++j) {
        w[j] /= total;
        largest = std::max(largest, w[j]);
      }
    }
    axis.first[static_cast<size_t>(i)] = first;
    axis.count[static_cast<size_t>(i)] = count;
  }
  // The most fractional bits for which the largest weight, doubled, still fits int16.
  int precision = 0;
  for (; precision < 22; ++precision) {
    if (static_cast<int>(0.5 + largest * static_cast<double>(1 << (precision + 1))) >= (1 << 15)) break;
  }
  axis.precision = precision;
  axis.weights.resize(real.size());
  for (size_t k = 0; k < real.size(); ++k) {
    const double v = real[k] * static_cast<double>(1 << precision);
    axis.weights[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return axis;
}

uint8_t round_shift_clamp(int64_t sum, int precision) {
  return static_cast<uint8_t>(std::clamp<int64_t>(sum >> precision, 0, 255));
}

RgbImage resize_horizontal(const RgbImage& in, int64_t out_width) {
  const AxisWeights axis = axis_weights(in.width, out_width);
  RgbImage out;
  out.height = in.height;
  out.width = out_width;
  out.pixels.resize(static_cast<size_t>(out.height * out_width * 3));
  const int64_t half = int64_t{1} << (axis.precision - 1);
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* row = &in.pixels[static_cast<size_t>(y * in.width * 3)];
    uint8_t* dst = &out.pixels[static_cast<size_t>(y * out_width * 3)];
    for (int64_t x = 0; x < out_width; ++x) {
      const int16_t* w = &axis.weights[static_cast<size_t>(x * axis.taps)];
      const int64_t first = axis.first[static_cast<size_t>(x)];
      const int64_t count = axis.count[static_cast<size_t>(x)];
      for (int c = 0; c < 3; ++c) {
        int64_t sum = half;
        for (int64_t j = 0; j < count; ++j) sum += int64_t{row[(first + j) * 3 + c]} * w[j];
        dst[x * 3 + c] = round_shift_clamp(sum, axis.precision);
      }
    }
  }
  return out;
}

RgbImage resize_vertical(const RgbImage& in, int64_t out_height) {
  const AxisWeights axis = axis_weights(in.height, out_height);
  RgbImage out;
  out.height = out_height;
  out.width = in.width;
  const int64_t row_size = in.width * 3;
  out.pixels.resize(static_cast<size_t>(out_height * row_size));
  const int64_t half = int64_t{1} << (axis.precision - 1);
  std::vector<int64_t> sums(static_cast<size_t>(row_size));
  for (int64_t y = 0; y < out_height; ++y) {
    const int16_t* w = &axis.weights[static_cast<size_t>(y * axis.taps)];
    const int64_t first = axis.first[static_cast<size_t>(y)];
    const int64_t count = axis.count[static_cast<size_t>(y)];
    std::fill(sums.begin(), sums.end(), half);
    for (int64_t j = 0; j < count; ++j) {
      const uint8_t* row = &in.pixels[static_cast<size_t>((first + j) * row_size)];
      for (int64_t k = 0; k < row_size; ++k) sums[static_cast<size_t>(k)] += int64_t{row[k]} * w[j];
    }
    uint8_t* dst = &out.pixels[static_cast<size_t>(y * row_size)];
    for (int64_t k = 0; k < row_size; ++k) dst[k] = round_shift_clamp(sums[static_cast<size_t>(k)], axis.precision);
  }
  return out;
}

}  // namespace

RgbImage resize_bicubic_antialias(const RgbImage& image, int64_t out_height, int64_t out_width) {
  if (out_width == image.width && out_height == image.height) return image;
  if (out_width == image.width) return resize_vertical(image, out_height);
  RgbImage horizontal = resize_horizontal(image, out_width);
  if (out_height == image.height) return horizontal;
  return resize_vertical(horizontal, out_height);
}

}  // namespace kiln::vision
