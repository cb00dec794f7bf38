// The progress display of `kiln quantize` on stderr: a bar redrawn in place on a terminal (tensors done / total,
// work units per second), one line per finished tensor otherwise (logs of CI and batch jobs stay readable).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kiln::cli {

class QuantizeProgress {
 public:
  QuantizeProgress(int64_t tensors, int64_t units, const char* unit_name);
  // A tensor found finished in the partial output (a resumed run).
  void skipped(int64_t units);
  void start(const std::string& tensor);
  void advance(int64_t units);
  void finished(const std::string& tensor, int bits, double relative_error);
  // Clears the bar; what follows prints on a clean line.
  void close();
  double units_per_second() const;
  int64_t units_quantized() const { return units_done_ - units_skipped_; }

 private:
  void draw(bool force);
  int64_t tensors_, units_, tensors_done_ = 0, units_done_ = 0, units_skipped_ = 0;
  const char* unit_name_;
  std::string current_;
  bool tty_;
  std::chrono::steady_clock::time_point begin_, last_draw_;
};

}  // namespace kiln::cli
