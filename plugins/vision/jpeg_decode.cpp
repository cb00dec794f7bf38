// JPEG through libjpeg-turbo. Errors leave by longjmp from the error manager to the setjmp in run_libjpeg, whose
// locals are never read after a jump; the pixels and the Status live in the caller's JpegJob. A truncated file is
// an error (libjpeg would pad it with gray; PIL refuses it as truncated), and progressive files are limited in
// scans and memory so a hostile file cannot make decoding slow or large.
// jpeglib.h needs size_t and FILE declared before it; jerror.h (after it) names the warning codes.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <csetjmp>
#include <cstring>
#include <string>
#include <vector>

#include "image_decoders.h"

namespace kiln::vision {
namespace {

constexpr int kMaxScans = 500;
constexpr long kMaxWarnings = 1000;
constexpr long kMaxDecoderMemory = 1l << 30;

struct JpegJob {
  jpeg_error_mgr error_manager;  // first member: libjpeg hands back this pointer
  jmp_buf jump;
  jpeg_progress_mgr progress;
  char error[JMSG_LENGTH_MAX] = {};
  const DecodeLimits* limits = nullptr;
  Status limit_status;
  RgbImage image;
  std::vector<uint8_t> cmyk_row;
};

[[noreturn]] void jpeg_error_exit(j_common_ptr cinfo) {
  auto* job = reinterpret_cast<JpegJob*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, job->error);
  std::longjmp(job->jump, 1);
}

void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  // A warning: corrupt entropy data and the like decode on (as PIL does), but running out of data is the file
  // being truncated, and a flood of warnings is a file built to be slow.
  if (cinfo->err->msg_code == JWRN_JPEG_EOF || ++cinfo->err->num_warnings > kMaxWarnings) jpeg_error_exit(cinfo);
}

void jpeg_check_progress(j_common_ptr cinfo) {
  auto* decompress = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (decompress->input_scan_number > kMaxScans) {
    auto* job = reinterpret_cast<JpegJob*>(cinfo->err);
    std::snprintf(job->error, sizeof(job->error), "more than %d progressive scans", kMaxScans);
    std::longjmp(job->jump, 1);
  }
}

// PIL's CMYK → RGB (cmyk2rgb): R = (255−K) − C·(255−K)/255 with its rounded 8-bit division. PIL reads every CMYK
// JPEG as Adobe-inverted (rawmode "CMYK;I", marker or not), so the samples are inverted first.
uint8_t cmyk_channel(unsigned c, unsigned k) {
  const unsigned nk = 255 - k;
  const unsigned t = c * nk + 128;
  const unsigned product = ((t >> 8) + t) >> 8;
  return static_cast<uint8_t>(nk - product);
}

// 0: decoded; 1: libjpeg refused the data (job->error); 2: dimensions over the limits (job->limit_status).
int run_libjpeg(jpeg_decompress_struct* cinfo, std::span<const uint8_t> bytes, JpegJob* job) {
  if (setjmp(job->jump)) return 1;
  jpeg_create_decompress(cinfo);
  cinfo->mem->max_memory_to_use = kMaxDecoderMemory;
  cinfo->progress = &job->progress;
  jpeg_mem_src(cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  job->limit_status = check_dimensions(cinfo->image_height, cinfo->image_width, *job->limits, "JPEG");
  if (!job->limit_status.ok()) return 2;

  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  if (cmyk) {
    cinfo->out_color_space = JCS_CMYK;
  } else if (cinfo->num_components == 1 || cinfo->num_components == 3) {
    cinfo->out_color_space = JCS_RGB;
  } else {
    std::snprintf(job->error, sizeof(job->error), "unsupported color space with %d components", cinfo->num_components);
    return 1;
  }
  jpeg_start_decompress(cinfo);
  if (cinfo->output_width != cinfo->image_width || cinfo->output_height != cinfo->image_height ||
      cinfo->output_components != (cmyk ? 4 : 3)) {
    std::snprintf(job->error, sizeof(job->error), "unexpected output layout");
    return 1;
  }
  const size_t width = cinfo->output_width;
  job->image.height = cinfo->output_height;
  job->image.width = cinfo->output_width;
  job->image.pixels.resize(width * cinfo->output_height * 3);
  if (cmyk) job->cmyk_row.resize(width * 4);
  while (cinfo->output_scanline < cinfo->output_height) {
    uint8_t* out = &job->image.pixels[size_t{cinfo->output_scanline} * width * 3];
    JSAMPROW row = cmyk ? job->cmyk_row.data() : out;
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      std::snprintf(job->error, sizeof(job->error), "no scanline");
      return 1;
    }
    if (!cmyk) continue;
    for (size_t x = 0; x < width; ++x) {
      unsigned ink[4];
      for (int i = 0; i < 4; ++i) ink[i] = 255u - job->cmyk_row[4 * x + i];
      for (int c = 0; c < 3; ++c) out[3 * x + c] = cmyk_channel(ink[c], ink[3]);
    }
  }
  return 0;
}

}  // namespace

Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  JpegJob job;
  job.limits = &limits;
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));
  cinfo.err = jpeg_std_error(&job.error_manager);
  job.error_manager.error_exit = jpeg_error_exit;
  job.error_manager.emit_message = jpeg_emit_message;
  job.progress.progress_monitor = jpeg_check_progress;
  const int outcome = run_libjpeg(&cinfo, bytes, &job);
  jpeg_destroy_decompress(&cinfo);
  if (outcome == 2) return job.limit_status;
  if (outcome != 0) return invalid_argument(std::string("corrupt JPEG (") + job.error + ")");
  return std::move(job.image);
}

}  // namespace kiln::vision
