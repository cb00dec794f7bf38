// PNG through libpng. libpng reports errors by longjmp to a setjmp: the setjmp lives in run_libpng, whose own
// locals are never read after a jump; every C++ object it fills (pixels, row pointers, the Status) belongs to the
// caller and is reached through the PngJob pointer, so a jump skips no destructor and leaves no stale local.
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "image_decoders.h"

namespace kiln::vision {
namespace {

struct PngJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t offset = 0;
  const DecodeLimits* limits = nullptr;
  char error[200] = {};
  Status limit_status;  // set when the header's dimensions are refused
  RgbImage image;
  std::vector<uint8_t> gray16;  // 16-bit gray is clipped by hand (PIL's I;16 → RGB): libpng has no such transform
  std::vector<png_bytep> rows;
  bool clip_gray16 = false;
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (length > job->size - job->offset) png_error(png, "truncated");
  std::memcpy(out, job->data + job->offset, length);
  job->offset += length;
}

[[noreturn]] void png_error_to_message(png_structp png, png_const_charp message) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->error, sizeof(job->error), "%s", message ? message : "error");
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

// 0: decoded; 1: libpng refused the data (job->error says why); 2: dimensions over the limits (job->limit_status).
int run_libpng(png_structp png, png_infop info, PngJob* job) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_set_read_fn(png, job, png_read_from_memory);
  // Ancillary chunks (text, ICC profiles) are not needed; bound what libpng may allocate for them.
  png_set_chunk_malloc_max(png, 8u << 20);
  png_read_info(png, info);

  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  job->limit_status = check_dimensions(height, width, *job->limits, "PNG");
  if (!job->limit_status.ok()) return 2;

  job->clip_gray16 = color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 16;
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16 && !job->clip_gray16) png_set_strip_16(png);  // the high byte, as PIL's 16-bit unpackers
  if ((color_type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
  if ((color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) && !job->clip_gray16)
    png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);

  const size_t row_bytes = png_get_rowbytes(png, info);
  if (row_bytes != size_t{width} * (job->clip_gray16 ? 2 : 3)) png_error(png, "unexpected row layout");
  job->image.height = height;
  job->image.width = width;
  std::vector<uint8_t>& target = job->clip_gray16 ? job->gray16 : job->image.pixels;
  target.resize(row_bytes * height);
  job->rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) job->rows[y] = target.data() + y * row_bytes;
  png_read_image(png, job->rows.data());
  return 0;
}

}  // namespace

Result<RgbImage> decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  PngJob job;
  job.data = bytes.data();
  job.size = bytes.size();
  job.limits = &limits;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_error_to_message, png_ignore_warning);
  if (png == nullptr) return resource_exhausted("PNG: cannot create a decoder");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return resource_exhausted("PNG: cannot create a decoder");
  }
  const int outcome = run_libpng(png, info, &job);
  png_destroy_read_struct(&png, &info, nullptr);
  if (outcome == 2) return job.limit_status;
  if (outcome != 0) return invalid_argument(std::string("corrupt PNG (") + job.error + ")");

  if (job.clip_gray16) {
    const size_t pixels = static_cast<size_t>(job.image.height * job.image.width);
    job.image.pixels.resize(pixels * 3);
    for (size_t i = 0; i < pixels; ++i) {
      const unsigned value = (unsigned{job.gray16[2 * i]} << 8) | job.gray16[2 * i + 1];
      std::fill_n(&job.image.pixels[3 * i], 3, static_cast<uint8_t>(std::min(value, 255u)));
    }
  }
  return std::move(job.image);
}

}  // namespace kiln::vision
