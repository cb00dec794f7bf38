#include "quantize_job.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <vector>

#include <nlohmann/json.hpp>

#include "json_text.h"
#include "kernels/cpu/half_float.h"
#include "model/checkpoint.h"
#include "quantize_progress.h"
#include "safetensors_output.h"

namespace kiln::cli {
namespace fs = std::filesystem;
namespace {

using Json = nlohmann::ordered_json;

constexpr char kPartialDir[] = ".partial";
constexpr char kJobFile[] = "job.json";

enum class Role { kKeep, kBody, kHead };

struct Planned {
  std::string name;
  Role role = Role::kKeep;
  int bits = 0;
  TensorView view;
};

std::string module_of(const std::string& weight) { return weight.substr(0, weight.size() - 7); }  // drops ".weight"

bool is_routed_expert(const std::string& name) {
  static const std::regex re(R"(\.mlp\.experts\.[0-9]+\.(gate|up|down)_proj\.weight$)");
  return std::regex_search(name, re);
}

// A decoder Linear: a 2-D `.weight` inside model.layers that is not the router, an embedding, a norm or an MTP
// layer's head (those stay as they are, like upstream).
bool is_decoder_linear(const std::string& name, const TensorView& t) {
  return name.starts_with("model.layers.") && name.ends_with(".weight") && t.rank == 2 &&
         !name.ends_with(".mlp.gate.weight") && name.find("embed_tokens") == std::string::npos &&
         name.find("shared_head") == std::string::npos && name.find("norm") == std::string::npos;
}

// Seeds differ per tensor and do not depend on the order tensors are processed in (FNV-1a, then splitmix64).
uint64_t tensor_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  h ^= seed + 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

Result<Json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return not_found(path.string() + ": cannot read it");
  try {
    return Json::parse(in);
  } catch (const std::exception& e) {
    return invalid_argument(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

Status write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = fs::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) return internal_error("cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return internal_error("cannot rename " + tmp.string() + ": " + ec.message());
  return ok_status();
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kF32) std::copy_n(t.as<const float>(), out.size(), out.data());
  if (t.dtype == DType::kBF16) cpu::bf16_to_float(t.as<const uint16_t>(), out.data(), t.numel());
  if (t.dtype == DType::kF16) cpu::fp16_to_float(t.as<const uint16_t>(), out.data(), t.numel());
  return out;
}

// What a partial output must have been made with to be reused.
Json job_identity(const QuantizeJob& job) {
  return Json{{"input", fs::absolute(job.in).lexically_normal().string()},
              {"format", job.format},
              {"bits", job.body.bits},
              {"codebook", job.body.codebook},
              {"head_bits", job.head_bits},
              {"experts_only", job.experts_only},
              {"only", job.only},
              {"seed", job.seed}};
}

Status prepare_partial(const QuantizeJob& job, const fs::path& partial) {
  std::error_code ec;
  fs::create_directories(partial, ec);
  if (ec) return internal_error("cannot create " + partial.string() + ": " + ec.message());
  const Json identity = job_identity(job);
  const fs::path file = partial / kJobFile;
  if (fs::exists(file)) {
    KILN_ASSIGN_OR_RETURN(Json old, read_json(file));
    if (old != identity)
      return failed_precondition(file.string() + " records another job (" + json_text(old) + ", now " +
                                 json_text(identity) + "): remove " + partial.string() +
                                 " to start over, or rerun with the same options");
    return ok_status();
  }
  return write_text(file, json_text(identity, 2) + "\n");
}

Result<std::vector<Planned>> plan(const QuantizeJob& job, const Checkpoint& ckpt) {
  std::optional<std::regex> only;
  if (!job.only.empty()) {
    try {
      only.emplace(job.only);
    } catch (const std::regex_error& e) {
      return invalid_argument("--only `" + job.only + "` is not a regular expression: " + e.what());
    }
  }
  std::vector<Planned> out;
  for (const std::string& name : ckpt.names()) {
    KILN_ASSIGN_OR_RETURN(TensorView t, ckpt.get(name));
    Planned p{name, Role::kKeep, 0, t};
    const bool head = name == "lm_head.weight";
    if (name.ends_with("_proj.weight") && t.rank != 2)
      return invalid_argument("`" + name + "` in " + ckpt.directory().string() + " is " + t.shape_string() +
                              ", not a 2-D Linear weight [out, in] (fused 3-D expert stacks are not supported)");
    const bool wanted = job.experts_only ? is_routed_expert(name)
                                         : (is_decoder_linear(name, t) || (head && job.head_bits != QuantizeJob::kKeepDense));
    if (wanted && (!only || std::regex_search(name, *only))) {
      if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
        return invalid_argument("`" + name + "` in " + ckpt.directory().string() + " is " + dtype_name(t.dtype) +
                                "; kiln quantize converts F32, BF16 and F16 weights");
      if (t.rank != 2 || t.shape[0] <= 0 || t.shape[1] <= 0)
        return invalid_argument("`" + name + "` in " + ckpt.directory().string() + " is " + t.shape_string() +
                                ", not a 2-D Linear weight");
      p.role = head ? Role::kHead : Role::kBody;
      p.bits = head ? job.head_bits : job.body.bits;
    }
    out.push_back(p);
  }
  return out;
}

struct Shard {
  std::vector<OutputTensor> tensors;
  uint64_t bytes = 0;
};

Status write_shards(const fs::path& out_dir, const std::vector<OutputTensor>& tensors, uint64_t max_bytes,
                    QuantizeReport& report) {
  std::vector<Shard> shards(1);
  for (const auto& t : tensors) {
    if (!shards.back().tensors.empty() && shards.back().bytes + t.nbytes() > max_bytes) shards.emplace_back();
    shards.back().tensors.push_back(t);
    shards.back().bytes += t.nbytes();
  }
  std::error_code ec;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  report.shards = static_cast<int>(shards.size());
  report.bytes = 0;
  for (const auto& s : shards) report.bytes += s.bytes;
  if (shards.size() == 1) {
    fs::remove(out_dir / Checkpoint::kIndexFileName, ec);
    return write_safetensors(out_dir / Checkpoint::kSingleFileName, shards[0].tensors, metadata);
  }
  // The reader prefers model.safetensors over an index: one left by an earlier run must not shadow the shards.
  fs::remove(out_dir / Checkpoint::kSingleFileName, ec);
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    KILN_RETURN_IF_ERROR(write_safetensors(out_dir / file, shards[i].tensors, metadata));
    for (const auto& t : shards[i].tensors) weight_map[t.name] = file;
  }
  Json index = {{"metadata", {{"total_size", report.bytes}}}, {"weight_map", weight_map}};
  return write_text(out_dir / Checkpoint::kIndexFileName, index.dump(2) + "\n");
}

Status copy_side_files(const fs::path& in, const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(in)) {
    if (!entry.is_regular_file()) continue;
    const fs::path p = entry.path();
    const std::string name = p.filename().string();
    if (name == "config.json" || p.extension() == ".safetensors" || name == Checkpoint::kIndexFileName) continue;
    std::error_code ec;
    fs::copy_file(p, out / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return internal_error("cannot copy " + p.string() + " to " + out.string() + ": " + ec.message());
  }
  return ok_status();
}

}  // namespace

Result<QuantizeReport> run_quantize_job(const QuantizeJob& job, Quantizer& quantizer) {
  const fs::path config_path = job.in / "config.json";
  if (!fs::is_directory(job.in)) return not_found(job.in.string() + ": not a directory (IN is an HF checkpoint directory)");
  if (!fs::exists(config_path)) return not_found(config_path.string() + ": missing (IN is an HF checkpoint directory)");
  std::error_code ec;
  if (fs::exists(job.out) && fs::equivalent(job.in, job.out, ec))
    return invalid_argument("OUT must differ from IN (" + job.in.string() + ")");
  KILN_RETURN_IF_ERROR(quantizer.check(job.body).with_context("--bits / --codebook"));
  if (job.head_bits != QuantizeJob::kKeepDense) {
    QuantizeOptions head = job.body;
    head.bits = job.head_bits;
    KILN_RETURN_IF_ERROR(quantizer.check(head).with_context("--head-bits (16 keeps the head dense)"));
  }
  KILN_ASSIGN_OR_RETURN(Json config, read_json(config_path));
  if (!config.is_object()) return invalid_argument(config_path.string() + ": not a JSON object");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(job.in));
  KILN_ASSIGN_OR_RETURN(std::vector<Planned> planned, plan(job, *ckpt));

  const fs::path partial = job.out / kPartialDir;
  KILN_RETURN_IF_ERROR(prepare_partial(job, partial));

  int64_t total = 0, total_units = 0;
  for (const auto& p : planned)
    if (p.role != Role::kKeep) {
      ++total;
      total_units += quantizer.work_units(p.view.shape[0], p.view.shape[1]);
    }
  QuantizeReport report;
  QuantizeProgress progress(total, total_units, "tiles");
  std::map<std::string, SafetensorsFile> done;  // weight name → its partial file
  double bits_sum = 0, bits_weight = 0;
  const auto begin = std::chrono::steady_clock::now();
  for (const auto& p : planned) {
    if (p.role == Role::kKeep) {
      ++report.kept;
      continue;
    }
    const fs::path file = partial / (module_of(p.name) + ".safetensors");
    const int64_t units = quantizer.work_units(p.view.shape[0], p.view.shape[1]);
    Result<SafetensorsFile> existing = fs::exists(file) ? SafetensorsFile::open(file) : Result<SafetensorsFile>(not_found(""));
    if (existing.ok()) {
      progress.skipped(units);
      ++report.resumed;
    } else {
      if (job.max_tensors >= 0 && report.quantized >= job.max_tensors) {
        progress.close();
        report.complete = false;
        report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        return report;
      }
      progress.start(p.name);
      const std::vector<float> w = to_f32(p.view);
      const TensorView view = TensorView::contiguous(const_cast<float*>(w.data()), DType::kF32, {p.view.shape[0], p.view.shape[1]});
      QuantizeOptions o = job.body;
      o.bits = p.bits;
      o.seed = tensor_seed(p.name, job.seed);
      KILN_ASSIGN_OR_RETURN(QuantizedWeight q, quantizer.quantize(view, o, [&](int64_t n) { progress.advance(n); }));
      std::vector<OutputTensor> tensors;
      for (const auto& t : q.tensors)
        tensors.push_back({module_of(p.name) + "." + t.suffix, t.dtype, t.shape, t.bytes.data()});
      char err[32];
      std::snprintf(err, sizeof err, "%.6g", q.relative_error);
      KILN_RETURN_IF_ERROR(write_safetensors(file, tensors, {{"bits", std::to_string(p.bits)}, {"relative_error", err}}));
      progress.finished(p.name, p.bits, q.relative_error);
      ++report.quantized;
      report.units += units;
      existing = SafetensorsFile::open(file);
      if (!existing.ok()) return existing.status();
    }
    const auto& meta = existing->metadata();
    // A resumed shard's metadata is a file's: a value that is not a number counts as absent (std::stod would throw).
    double rel = -1.0;
    if (meta.count("relative_error")) {
      const std::string& text = meta.at("relative_error");
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end != text.c_str() && *end == '\0' && std::isfinite(v)) rel = v;
    }
    const double n = static_cast<double>(p.view.numel());
    if (rel >= 0) {
      auto& stat = report.errors[p.bits];
      ++stat.tensors;
      stat.weighted_sq += rel * rel * n;
      stat.weight += n;
    }
    if (p.role == Role::kBody) {
      bits_sum += p.bits * n;
      bits_weight += n;
    }
    done.emplace(p.name, std::move(existing).value());
  }
  progress.close();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  report.units_per_second = report.seconds > 0 ? static_cast<double>(report.units) / report.seconds : 0;
  report.average_bits = bits_weight > 0 ? bits_sum / bits_weight : job.body.bits;

  // The output, in the input's tensor order: a converted weight's tensors where its `.weight` was, its bias in fp16
  // (the format's bias dtype), everything else as it was.
  std::vector<OutputTensor> tensors;
  std::vector<std::vector<uint16_t>> biases;
  biases.reserve(planned.size());
  for (const auto& p : planned) {
    auto it = done.find(p.name);
    if (it != done.end()) {
      for (const std::string& name : it->second.names()) {
        KILN_ASSIGN_OR_RETURN(TensorView t, it->second.get(name));
        tensors.push_back({name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank), t.data});
      }
      continue;
    }
    if (p.name.ends_with(".bias") && done.count(p.name.substr(0, p.name.size() - 5) + ".weight")) {
      const std::vector<float> f = to_f32(p.view);
      biases.emplace_back(f.size());
      cpu::float_to_fp16(f.data(), biases.back().data(), static_cast<int64_t>(f.size()));
      tensors.push_back({p.name, DType::kF16, {p.view.numel()}, biases.back().data()});
      continue;
    }
    tensors.push_back({p.name, p.view.dtype, std::vector<int64_t>(p.view.shape.begin(), p.view.shape.begin() + p.view.rank),
                       p.view.data});
  }
  KILN_RETURN_IF_ERROR(write_shards(job.out, tensors, job.max_shard_bytes, report));

  QuantizeSummary summary;
  summary.options = job.body;
  summary.average_bits = report.average_bits;
  summary.head_bits = done.count("lm_head.weight") ? job.head_bits : 0;
  try {
    config["quantization_config"] = Json::parse(quantizer.quantization_config(summary));
  } catch (const std::exception& e) {
    return internal_error(std::string("the quantizer's quantization_config is not JSON: ") + e.what());
  }
  KILN_RETURN_IF_ERROR(write_text(job.out / "config.json", config.dump(2) + "\n"));
  KILN_RETURN_IF_ERROR(copy_side_files(job.in, job.out));
  done.clear();
  if (!job.keep_partial) fs::remove_all(partial, ec);
  report.complete = true;
  return report;
}

}  // namespace kiln::cli
