#include "quantize_progress.h"

#include <unistd.h>

#include <cstdio>

namespace kiln::cli {

QuantizeProgress::QuantizeProgress(int64_t tensors, int64_t units, const char* unit_name)
    : tensors_(tensors), units_(units), unit_name_(unit_name), tty_(::isatty(2) != 0),
      begin_(std::chrono::steady_clock::now()), last_draw_(begin_) {}

double QuantizeProgress::units_per_second() const {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  return s > 0 ? static_cast<double>(units_done_ - units_skipped_) / s : 0.0;
}

void QuantizeProgress::skipped(int64_t units) {
  ++tensors_done_;
  units_done_ += units;
  units_skipped_ += units;
}

void QuantizeProgress::start(const std::string& tensor) {
  current_ = tensor;
  draw(true);
}

void QuantizeProgress::advance(int64_t units) {
  units_done_ += units;
  draw(false);
}

void QuantizeProgress::finished(const std::string& tensor, int bits, double relative_error) {
  ++tensors_done_;
  if (tty_) {
    draw(true);
    return;
  }
  std::fprintf(stderr, "[%lld/%lld] %s  K%d  rel.err %.4f  (%.1f %s/s)\n", static_cast<long long>(tensors_done_),
               static_cast<long long>(tensors_), tensor.c_str(), bits, relative_error, units_per_second(), unit_name_);
}

void QuantizeProgress::draw(bool force) {
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = units_ > 0 ? static_cast<int>(kWidth * units_done_ / units_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r\033[K[%s] %lld/%lld tensors  %lld/%lld %s  %.1f %s/s  %s", bar.c_str(),
               static_cast<long long>(tensors_done_), static_cast<long long>(tensors_),
               static_cast<long long>(units_done_), static_cast<long long>(units_), unit_name_, units_per_second(),
               unit_name_, current_.c_str());
  std::fflush(stderr);
}

void QuantizeProgress::close() {
  if (tty_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace kiln::cli
