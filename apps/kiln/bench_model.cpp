#include "bench_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "engine/engine_factory.h"
#include "engine/instance_runner.h"
#include "engine/memory_model.h"
#include "kiln/log.h"
#include "memory_screen_gate.h"
#include "model/arch/architecture.h"
#include "model/mla_moe_architecture.h"
#include "model/model_cost.h"
#include "plugin/registry.h"
#include "recipe/recipe.h"
#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string format(const char* fmt, double a, double b = 0) {
  char buf[96];
  std::snprintf(buf, sizeof buf, fmt, a, b);
  return buf;
}

std::string gib(double bytes) { return format("%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

// Token ids spread over the vocabulary (their values do not change the work; varied so embedding rows differ).
int32_t token_at(int64_t i, int64_t vocab) { return static_cast<int32_t>((i * 7919 + 13) % vocab); }

std::string device_name(const LoadedModel& m, const Recipe& recipe) {
#ifdef KILN_WITH_CUDA
  if (m.on_gpu()) {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      return std::string(prop.name) + " (" + gib(static_cast<double>(prop.totalGlobalMem)) + ")";
    return "CUDA device";
  }
#endif
  int64_t threads = recipe.section("model").get_int("threads", 0);
  if (threads <= 0) threads = std::thread::hardware_concurrency();
  return "CPU (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
}

// Seconds of `reps` copies of `bytes` on the CPU, split evenly over `threads` threads (each its own slice).
double cpu_copy_seconds(char* dst, const char* src, size_t bytes, int threads, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    std::vector<std::thread> pool;
    const size_t slice = (bytes / threads + 63) / 64 * 64;
    for (int t = 0; t < threads; ++t) {
      const size_t begin = std::min(bytes, slice * t), end = std::min(bytes, begin + slice);
      pool.emplace_back([=] { std::memcpy(dst + begin, src + begin, end - begin); });
    }
    for (std::thread& th : pool) th.join();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Blocks [first, first + count) as one sequence's block table.
std::vector<int32_t> block_range(int64_t first, int64_t count) {
  std::vector<int32_t> table(count);
  for (int64_t b = 0; b < count; ++b) table[b] = static_cast<int32_t>(first + b);
  return table;
}

int64_t blocks_for(int64_t positions, int64_t block_size) { return (positions + block_size - 1) / block_size; }

}  // namespace

double measure_copy_bandwidth(const BenchTarget& target, std::string& how) {
  constexpr int kReps = 8;
#ifdef KILN_WITH_CUDA
  if (target.model.on_gpu()) {
    // The pool has taken most of the device: the largest pair of buffers that still fits, from 128 MiB down.
    for (size_t bytes = size_t{128} << 20; bytes >= (size_t{64} << 20); bytes /= 2) {
      void* src = nullptr;
      void* dst = nullptr;
      if (cudaMalloc(&src, bytes) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      if (cudaMalloc(&dst, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(src);
        continue;
      }
      cudaEvent_t start, stop;
      float ms = 0;
      bool ok = cudaMemset(src, 1, bytes) == cudaSuccess && cudaEventCreate(&start) == cudaSuccess &&
                cudaEventCreate(&stop) == cudaSuccess && cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess &&
                cudaEventRecord(start) == cudaSuccess;
      for (int r = 0; ok && r < kReps; ++r) ok = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess;
      ok = ok && cudaEventRecord(stop) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess &&
           cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms > 0;
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      cudaFree(src);
      cudaFree(dst);
      if (!ok) return 0;
      how = "measured here: a " + std::to_string(bytes >> 20) + " MiB device-to-device copy, read + write";
      return 2.0 * static_cast<double>(bytes) * kReps / (ms * 1e-3);
    }
    return 0;
  }
#endif
  int threads = static_cast<int>(target.recipe.section("model").get_int("threads", 0));
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t bytes = size_t{128} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  cpu_copy_seconds(dst.data(), src.data(), bytes, threads, 1);  // pages touched, threads warm
  const double s = cpu_copy_seconds(dst.data(), src.data(), bytes, threads, kReps);
  how = "measured here: a 128 MiB memcpy over " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") +
        ", read + write";
  return s > 0 ? 2.0 * static_cast<double>(bytes) * kReps / s : 0;
}

Result<BenchTarget> open_bench_target(const std::string& recipe_file, const std::vector<std::string>& sets,
                                      const BenchShape& shape, bool cuda_graphs, bool ignore_screen,
                                      int64_t lookahead_slots) {
  KILN_ASSIGN_OR_RETURN(Recipe recipe, load_recipe(recipe_file, sets, global_registry()));
  // What can be refused from config.json is refused before any weight is read.
  const std::filesystem::path dir = recipe.section("model").get_string("path");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Architecture> arch, load_architecture(dir / "config.json"));
  const ModelConfig* family = mla_moe_config(*arch);
  if (!family)
    return unimplemented("kiln bench decode|prefill has cost models for the MLA + MoE family only; " +
                         arch->model_type() + " is not one");
  const int64_t max_positions = family->max_position_embeddings;
  if (max_positions > 0 && shape.positions > max_positions)
    return out_of_range("the benchmark needs " + std::to_string(shape.positions) + " positions per sequence, beyond the "
                        "model's " + std::to_string(max_positions) + " (max_position_embeddings in " + family->source +
                        ")");
  // The engine factory sizes the KV pool and the step workspace from [scheduler]: set it to the sweep's shapes,
  // each sequence on whole blocks of its own (the KV layout's pages: kv.block_size, times parallel.decode_context: a
  // block is one page on each rank of a decode-context group, as scheduler_block_size says once loaded).
  const int64_t bs = std::max<int64_t>(recipe.section("kv").get_int("block_size", 64), 1) *
                     std::max<int64_t>(recipe.section("parallel").get_int("decode_context", 1), 1);
  int64_t window = blocks_for(shape.positions, bs) * bs;
  if (max_positions > 0) window = std::min(window, max_positions);
  std::vector<std::string> sized = sets;
  sized.push_back("scheduler.max_model_len=" + std::to_string(window));
  sized.push_back("scheduler.max_num_seqs=" + std::to_string(shape.sequences));
  sized.push_back("scheduler.max_num_batched_tokens=" + std::to_string(std::max(shape.step_tokens, shape.sequences)));
  KILN_ASSIGN_OR_RETURN(Recipe sized_recipe, load_recipe(recipe_file, sized, global_registry()));
  // The screen sees what is loaded: the target model alone (a recipe's drafter is not part of what these
  // benchmarks time), in the pool and step the sweep sizes.
  std::vector<std::string> screened_sets = sized;
  screened_sets.push_back("speculative.method=none");
  auto screened_recipe = load_recipe(recipe_file, screened_sets, global_registry());
  std::string what = recipe_file;
  for (const std::string& set : sized) what += " --set " + set;
  const ScreenedRecipe screen = screen_recipe(screened_recipe.ok() ? *screened_recipe : sized_recipe, what, std::cout);
  if (!screen.refusal.empty()) {
    if (!ignore_screen) return resource_exhausted(screen.refusal + " (--ignore-screen loads it anyway)");
    log::warn("--ignore-screen: loading despite {}", screen.refusal);
  }

  BenchTarget t;
  KILN_ASSIGN_OR_RETURN(t.model, load_model(recipe, global_registry(), ModelLoadOptions{}));
  t.config = mla_moe_config(*t.model.arch);
  KILN_ASSIGN_OR_RETURN(EnginePlan plan, plan_engine(t.model, sized_recipe));
  if (lookahead_slots > 0) {
    plan.config.lookahead_slots = lookahead_slots;
    plan.config.prefix_caching = false;
  }
  t.capacity = plan.capacity;
  t.device = device_name(t.model, recipe);
  t.model.model->set_graphs(cuda_graphs);
  t.weight_gib = static_cast<double>(t.model.model->weight_bytes()) / (1 << 30);
  t.recipe = sized_recipe;
  t.pricing = recipe_weight_pricing(sized_recipe, t.pricing_basis);
  log::info("{}", t.capacity.report());
  KILN_ASSIGN_OR_RETURN(t.caches, make_cache_manager(t.model, plan));
  t.plan = plan;
  if (screen.model) {  // as start_engine does: the prediction beside what the process holds now
    const MeasuredMemory measured = measure_memory(*screen.model, t.model.on_gpu(), checkpoint_bytes(t.model));
    if (memory_within(*screen.model, measured))
      log::info("{}", memory_comparison(*screen.model, measured));
    else
      log::warn("{}", memory_comparison(*screen.model, measured));
  }
  t.runner = std::make_unique<InstanceRunner>(*t.model.model, *t.caches);
  return t;
}

int64_t decode_positions(int64_t context, const DecodeBenchOptions& o) {
  return context + o.warmup + o.steps + *std::max_element(o.rows.begin(), o.rows.end()) - 1;
}

Result<std::vector<DecodePoint>> run_decode_bench(BenchTarget& t, const DecodeBenchOptions& o) {
  const ModelConfig& c = *t.config;
  const int64_t bs = t.capacity.block_size;
  std::vector<DecodePoint> points;
  StepOutput out;
  for (int64_t context : o.contexts)
    for (int64_t batch : o.batches)
      for (int64_t rows : o.rows) {
      DecodePoint p;
      p.context = context;
      p.batch = batch;
      p.rows = rows;
      const int64_t per_seq = blocks_for(decode_positions(context, o), bs);
      if (batch * per_seq > t.capacity.num_blocks) {
        p.skipped = "KV of " + std::to_string(batch) + " × " + std::to_string(per_seq * bs) + " tokens (" +
                    gib(static_cast<double>(t.capacity.bytes) / t.capacity.num_blocks * batch * per_seq) +
                    ") exceeds the pool (" + gib(static_cast<double>(t.capacity.bytes)) + ")";
        log::warn("decode context {} batch {}: skipped, {}", context, batch, p.skipped);
        points.push_back(p);
        continue;
      }
      std::vector<std::vector<int32_t>> tables(batch);
      std::vector<int32_t> tokens(batch * rows);
      std::vector<SequenceStep> steps(batch);
      // What the engine asks of a decode (greedy selection) or a verification pass (rows − 1 drafts).
      std::vector<TokenSelection> select(batch);
      for (int64_t b = 0; b < batch; ++b) {
        tables[b] = block_range(b * per_seq, per_seq);
        steps[b] = SequenceStep{{tokens.data() + b * rows, static_cast<size_t>(rows)}, 0, &tables[b], rows > 1, -1, {}};
        select[b].select = true;
        select[b].num_drafts = static_cast<int32_t>(rows - 1);
        select[b].drafts = std::span<const int32_t>(tokens.data() + b * rows + 1, rows - 1);
      }
      int64_t step_index = 0;
      auto step = [&](int64_t position) -> Status {
        for (int64_t b = 0; b < batch; ++b) steps[b].start_position = position;
        for (int32_t& t : tokens) t = token_at(++step_index, c.vocab_size);
        return t.runner->step(steps, select, {}, out).with_context("decode at context " + std::to_string(context) +
                                                                   ", batch " + std::to_string(batch));
      };
      for (int64_t w = 0; w < o.warmup; ++w) KILN_RETURN_IF_ERROR(step(context + w));
      ModelInstance& model = *t.model.model;
      model.set_step_profiling(o.profile);
      model.clear_step_profile();
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < o.steps; ++i) KILN_RETURN_IF_ERROR(step(context + o.warmup + i));
      p.seconds = seconds_since(t0);
      p.ms_per_step = 1e3 * p.seconds / o.steps;
      if (o.profile && model.profiled_steps() > 0) {
        for (auto [stage, ms] : model.step_profile())
          p.stages.emplace_back(stage, ms / static_cast<double>(model.profiled_steps()));
        model.set_step_profiling(false);
      }
      p.tok_s = static_cast<double>(batch * rows * o.steps) / p.seconds;  // rows run (= tokens when rows = 1)
      // A step at position q attends over q + 1 keys; the mean over the timed steps.
      const double keys = static_cast<double>(context + o.warmup) + (o.steps - 1) / 2.0 + 1;
      p.weight_bytes = decode_weight_bytes(c, batch * rows, t.pricing);
      // The pool's bytes per token (the recipe's KV layout, fp8 rows included), not bf16's.
      p.kv_bytes = decode_kv_bytes(c, batch, keys, static_cast<double>(t.capacity.bytes) /
                                                       static_cast<double>(std::max<int64_t>(t.capacity.tokens(), 1)));
      p.roofline_tok_s = batch * rows * o.bandwidth / (p.weight_bytes + p.kv_bytes);
      log::info("decode context {} batch {} rows {}: {:.1f} tok/s", context, batch, rows, p.tok_s);
      points.push_back(p);
      }
  return points;
}

Result<std::vector<PrefillPoint>> run_prefill_bench(BenchTarget& t, const PrefillBenchOptions& o) {
  const ModelConfig& c = *t.config;
  const int64_t bs = t.capacity.block_size;
  const int64_t longest = *std::max_element(o.lengths.begin(), o.lengths.end());
  std::vector<int32_t> prompt(longest);
  for (int64_t i = 0; i < longest; ++i) prompt[i] = token_at(i, c.vocab_size);
  // open_bench_target sized the pool for at least the longest prompt.
  const std::vector<int32_t> table = block_range(0, blocks_for(longest, bs));
  StepOutput out;
  // Each chunk's last row is selected greedily, as the engine selects a prompt's first token.
  TokenSelection greedy;
  greedy.select = true;
  {  // One untimed chunk first: the runner sizes its step buffers on the first pass of a shape.
    SequenceStep s{{prompt.data(), static_cast<size_t>(std::min(o.chunk, longest))}, 0, &table, false, -1, {}};
    KILN_RETURN_IF_ERROR(t.runner->step({&s, 1}, {&greedy, 1}, {}, out).with_context("prefill warm-up"));
  }
  std::vector<PrefillPoint> points;
  for (int64_t length : o.lengths) {
    PrefillPoint p;
    p.length = length;
    p.chunks = (length + o.chunk - 1) / o.chunk;
    const auto t0 = Clock::now();
    auto last_report = t0;
    for (int64_t start = 0; start < length; start += o.chunk) {
      const int64_t n = std::min(o.chunk, length - start);
      SequenceStep s{{prompt.data() + start, static_cast<size_t>(n)}, start, &table, false, -1, {}};
      KILN_RETURN_IF_ERROR(t.runner->step({&s, 1}, {&greedy, 1}, {}, out)
                               .with_context("prefill of " + std::to_string(length) + " at " + std::to_string(start)));
      if (seconds_since(last_report) > 10) {  // long prompts on slow paths: show that it is moving
        log::info("prefill {}: {} of {} tokens in {:.1f} s", length, start + n, length, seconds_since(t0));
        last_report = Clock::now();
      }
    }
    p.seconds = seconds_since(t0);
    if (o.profile) {  // the same prompt again, each stage between CUDA events (ms summed over its chunks)
      ModelInstance& model = *t.model.model;
      model.set_step_profiling(true);
      model.clear_step_profile();
      for (int64_t start = 0; start < length; start += o.chunk) {
        const int64_t n = std::min(o.chunk, length - start);
        SequenceStep s{{prompt.data() + start, static_cast<size_t>(n)}, start, &table, false, -1, {}};
        KILN_RETURN_IF_ERROR(t.runner->step({&s, 1}, {&greedy, 1}, {}, out).with_context("profiled prefill"));
      }
      p.stages = model.step_profile();
      model.set_step_profiling(false);
      if (p.stages.empty()) p.stages.emplace_back("(this model's device has no stage timer: CUDA models only)", 0.0);
    }
    p.tok_s = static_cast<double>(length) / p.seconds;
    p.flops = prefill_flops(c, length, o.chunk);
    p.tflops = p.flops / p.seconds / 1e12;
    log::info("prefill {}: {:.1f} tok/s", length, p.tok_s);
    points.push_back(p);
  }
  return points;
}

std::string decode_table(const std::vector<DecodePoint>& points) {
  std::string s =
      "| context | batch | rows/seq | tok/s | ms/step | roofline tok/s | % of roofline | weights GB/step | KV GB/step |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const DecodePoint& p : points) {
    s += "| " + std::to_string(p.context) + " | " + std::to_string(p.batch) + " | " + std::to_string(p.rows) + " | ";
    if (!p.skipped.empty()) {
      s += "skipped: " + p.skipped + " | | | | | |\n";
      continue;
    }
    s += format("%.1f | %.3f | ", p.tok_s, p.ms_per_step) + format("%.1f | %.1f %% | ", p.roofline_tok_s, 100 * p.tok_s / p.roofline_tok_s) +
         format("%.4g | %.4g |\n", p.weight_bytes / 1e9, p.kv_bytes / 1e9);
  }
  return s;
}

namespace {

double stage_total(const std::vector<std::pair<std::string, double>>& stages) {
  double total = 0;
  for (const auto& [stage, ms] : stages) total += ms;
  return total;
}

// | stage | ms/<unit> | share | rows after a title line.
std::string stage_table(const std::string& title, const std::vector<std::pair<std::string, double>>& stages,
                        const char* unit) {
  const double total = std::max(stage_total(stages), 1e-30);
  std::string s = "\n" + title + "\n\n| stage | ms/" + unit + " | share |\n|---|---|---|\n";
  for (const auto& [stage, ms] : stages) s += "| " + stage + format(" | %.3f | %.1f %% |\n", ms, 100 * ms / total);
  return s;
}

}  // namespace

std::string stage_tables(const std::vector<DecodePoint>& points) {
  std::string s;
  for (const DecodePoint& p : points) {
    if (p.stages.empty()) continue;
    s += stage_table("Where a step's GPU time goes: context " + std::to_string(p.context) + ", batch " +
                         std::to_string(p.batch) + ", " + std::to_string(p.rows) + " rows/seq (" +
                         format("%.3f ms of stream time per step, %.3f ms wall)", stage_total(p.stages), p.ms_per_step),
                     p.stages, "step");
  }
  return s;
}

std::string stage_tables(const std::vector<PrefillPoint>& points) {
  std::string s;
  for (const PrefillPoint& p : points) {
    if (p.stages.empty()) continue;
    s += stage_table("Where a prompt's GPU time goes: " + std::to_string(p.length) + " tokens in " +
                         std::to_string(p.chunks) + " chunks (" +
                         format("%.1f ms of stream time with the stage timer, %.1f ms timed without it)",
                                stage_total(p.stages), 1e3 * p.seconds),
                     p.stages, "prompt");
  }
  return s;
}

std::string prefill_table(const std::vector<PrefillPoint>& points, const PrefillBenchOptions& o) {
  std::string s =
      "| prompt tokens | chunks | seconds | tok/s | model TFLOP | TFLOP/s | % of peak |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const PrefillPoint& p : points) {
    s += "| " + std::to_string(p.length) + " | " + std::to_string(p.chunks) + " | ";
    s += format("%.3f | %.1f | ", p.seconds, p.tok_s) + format("%.4g | %.4g | ", p.flops / 1e12, p.tflops) +
         format("%.3g %% |\n", 100 * p.tflops / o.peak_tflops);
  }
  return s;
}

nlohmann::json decode_json(const std::vector<DecodePoint>& points, const DecodeBenchOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  for (const DecodePoint& p : points) {
    nlohmann::json r = {{"context", p.context}, {"batch", p.batch}, {"rows_per_sequence", p.rows}};
    if (!p.skipped.empty()) {
      r["skipped"] = p.skipped;
    } else {
      r.update({{"seconds", p.seconds},
                {"steps", o.steps},
                {"tok_s", p.tok_s},
                {"ms_per_step", p.ms_per_step},
                {"weight_bytes_per_step", p.weight_bytes},
                {"kv_bytes_per_step", p.kv_bytes},
                {"roofline_tok_s", p.roofline_tok_s},
                {"roofline_fraction", p.tok_s / p.roofline_tok_s}});
    }
    rows.push_back(r);
  }
  return {{"steps", o.steps}, {"warmup", o.warmup}, {"bandwidth_bytes_per_s", o.bandwidth}, {"points", rows}};
}

nlohmann::json prefill_json(const std::vector<PrefillPoint>& points, const PrefillBenchOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PrefillPoint& p : points) {
    rows.push_back({{"length", p.length},
                    {"chunks", p.chunks},
                    {"seconds", p.seconds},
                    {"tok_s", p.tok_s},
                    {"model_flops", p.flops},
                    {"tflops", p.tflops},
                    {"peak_fraction", p.tflops / o.peak_tflops}});
  }
  return {{"chunk", o.chunk}, {"peak_tflops", o.peak_tflops}, {"points", rows}};
}

}  // namespace kiln::cli
