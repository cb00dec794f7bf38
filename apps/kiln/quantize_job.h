// The format-independent half of `kiln quantize`: which tensors of an HF checkpoint to convert, per-tensor partial
// files that make a killed run resumable, the final shards, config.json with the format's quantization_config,
// and the tokenizer and other side files. The math is the Quantizer's (kiln/quantizer.h), found in the plugins.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "kiln/quantizer.h"

namespace kiln::cli {

struct QuantizeJob {
  std::filesystem::path in, out;
  std::string format = "exl3";
  QuantizeOptions body;              // the decoder Linears' options (bits, codebook, threads)
  int head_bits = 6;                 // lm_head; kKeepDense leaves it as it is
  bool experts_only = false;         // only mlp.experts.N.{gate,up,down}_proj
  std::string only;                  // a regex: only weights whose names match are quantized ("" = all)
  int64_t max_tensors = -1;          // stop after this many newly quantized tensors (≥ 0; tests of resuming)
  uint64_t seed = 0;                 // mixed with each tensor's name into its QuantizeOptions::seed
  uint64_t max_shard_bytes = 4ull << 30;
  bool keep_partial = false;         // keep OUT/.partial after the shards are written

  static constexpr int kKeepDense = 16;
};

struct QuantizeReport {
  bool complete = false;             // false: stopped at max_tensors, rerun to continue
  int64_t quantized = 0, resumed = 0, kept = 0;   // tensors
  int64_t units = 0;                 // work units quantized in this run
  double seconds = 0, units_per_second = 0;
  double average_bits = 0;
  // Per bits: number of tensors and the element-weighted mean of ‖W − Ŵ‖² / ‖W‖² (reported as its root).
  struct ErrorStat {
    int64_t tensors = 0;
    double weighted_sq = 0, weight = 0;
  };
  std::map<int, ErrorStat> errors;
  int shards = 0;
  uint64_t bytes = 0;
};

// Errors name the file or tensor: IN without config.json, a checkpoint the reader refuses, a selected weight of an
// unsupported dtype or not 2-D, options the quantizer refuses, a partial output made with other options.
Result<QuantizeReport> run_quantize_job(const QuantizeJob& job, Quantizer& quantizer);

}  // namespace kiln::cli
