// `kiln quantize --bits K [--codebook NAME] [--head-bits 6] [--experts-only] [--threads N] IN OUT`: an HF checkpoint
// → a quantized checkpoint of a weight format whose plugin provides a quantizer (exl3). The walk over the checkpoint
// is quantize_job.cpp; the math is the plugin's.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "kiln/quantizer.h"
#include "plugin/registry.h"
#include "quantize_job.h"

namespace kiln::cli {

int cmd_quantize(int argc, char** argv) {
  CommonOptions common;
  QuantizeJob job;
  std::string in, out;
  int max_shard_mb = 4096;
  po::options_description desc("kiln quantize options");
  desc.add_options()("help,h", "show this help")
      ("bits", po::value<int>(&job.body.bits)->required(), "bits per weight of the decoder Linears (exl3: 1..8)")
      ("codebook", po::value<std::string>(&job.body.codebook), "format variant (exl3: mcg, mul1 or 3inst; default mul1)")
      ("head-bits", po::value<int>(&job.head_bits)->default_value(6), "bits of lm_head; 16 keeps it dense")
      ("experts-only", po::bool_switch(&job.experts_only), "quantize only routed experts (mlp.experts.N.*_proj); "
                                                           "the head and everything else stay dense")
      ("threads", po::value<int>(&job.body.threads)->default_value(0), "CPU threads (0 = all)")
      ("format", po::value<std::string>(&job.format)->default_value("exl3"), "the weight format to write")
      ("only", po::value<std::string>(&job.only), "quantize only the selected weights whose names match this regex")
      ("seed", po::value<uint64_t>(&job.seed)->default_value(0), "seed of the random sign vectors")
      ("max-shard-mb", po::value<int>(&max_shard_mb)->default_value(4096), "largest output shard")
      ("max-tensors", po::value<int64_t>(&job.max_tensors)->default_value(-1),
       "stop after quantizing this many tensors (resume by rerunning)")
      ("keep-partial", po::bool_switch(&job.keep_partial), "keep OUT/.partial (per-tensor results) after finishing")
      ("in", po::value<std::string>(&in)->required(), "HF checkpoint directory")
      ("out", po::value<std::string>(&out)->required(), "output directory");
  add_common_options(desc, common);
  po::positional_options_description pos;
  pos.add("in", 1).add("out", 1);
  po::variables_map vm;
  int rc = parse_or_exit(argc, argv, desc, pos, vm,
                         "usage: kiln quantize --bits K [--codebook NAME] [--head-bits 6] [--experts-only] "
                         "[--threads N] IN OUT\n"
                         "Quantizes an HF checkpoint (config.json + *.safetensors, bf16/fp16/fp32) into OUT.\n"
                         "Resumable: a rerun with the same options skips the tensors already in OUT/.partial.");
  if (rc >= 0) return rc;
  if (!setup_logging(common)) return 2;
  if (max_shard_mb <= 0) return fail("--max-shard-mb must be positive");
  job.max_shard_bytes = static_cast<uint64_t>(max_shard_mb) << 20;
  job.in = in;
  job.out = out;
  load_plugins(common);
  CreateContext ctx;
  ctx.device = Device::cpu();
  auto quantizer = global_registry().create<Quantizer>(job.format, ctx);
  if (!quantizer.ok()) return fail(quantizer.status().to_string());

  auto report = run_quantize_job(job, **quantizer);
  if (!report.ok()) return fail(report.status().to_string());
  const QuantizeReport& r = *report;
  const int threads = job.body.threads > 0 ? job.body.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::printf("%s: %lld tensors quantized, %lld resumed, %lld kept; %.1f s, %.1f tiles/s on %d threads\n",
              job.format.c_str(), static_cast<long long>(r.quantized), static_cast<long long>(r.resumed),
              static_cast<long long>(r.kept), r.seconds, r.units_per_second, threads);
  for (const auto& [bits, e] : r.errors)
    std::printf("  K%d: %lld tensors, relative RMS error %.4f (element-weighted)\n", bits,
                static_cast<long long>(e.tensors), e.weight > 0 ? std::sqrt(e.weighted_sq / e.weight) : 0.0);
  if (!r.complete) {
    std::printf("stopped after %lld tensors (--max-tensors); rerun the same command to continue\n",
                static_cast<long long>(r.quantized));
    return 3;
  }
  std::printf("wrote %s: %d shard(s), %.1f MB, average %.3g bits\n", out.c_str(), r.shards, r.bytes / 1e6,
              r.average_bits);
  return 0;
}

}  // namespace kiln::cli
