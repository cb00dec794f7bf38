// The `exl3` weight format and the plugin's entry point. Modules the checkpoint stores as EXL3 are decoded from
// their trellis. A stack of modules stored dense (what the quantizer left unquantized: attention and shared experts
// under --experts-only, the head at head_bits 16) goes to the built-in `dense` format the core offers in
// CreateContext::dense_weights, so it runs the core's kernels; only a stack mixing the two (gate_proj EXL3, up_proj
// dense in one Linear) is served by the plugin's own small dense path.
#include <string>

#include "exl3_cpu_linear.h"
#include "exl3_quantizer.h"
#include "kiln/plugin.h"
#if KILN_EXL3_WITH_CUDA
#include "cuda/exl3_cuda_format.h"
#include "kiln/device_context.h"
#endif
#include "kiln/weight_format.h"

namespace kiln::exl3 {
namespace {

class Exl3CpuWeightFormat final : public WeightFormat {
 public:
  explicit Exl3CpuWeightFormat(WeightFormat* dense) : dense_(dense) {}

  Result<std::unique_ptr<Linear>> load_linear(const WeightSource& source, const LinearSpec& spec) override {
    if (spec.names.empty() || spec.names.size() != spec.out_features.size() || spec.in_features <= 0)
      return invalid_argument("`exl3`: malformed linear request (" + std::to_string(spec.names.size()) + " names, " +
                              std::to_string(spec.out_features.size()) + " output sizes, in_features " +
                              std::to_string(spec.in_features) + ")");
    if (source.synthetic())
      return unimplemented("`model.load = \"dummy\"` is not provided by the `exl3` format on the CPU; set "
                           "model.load = \"mmap\"");
    if (dense_ && all_stored_dense(source, spec.names)) return dense_->load_linear(source, spec);
    std::vector<Part> parts;
    for (size_t i = 0; i < spec.names.size(); ++i) {
      if (spec.out_features[i] <= 0) return invalid_argument("`" + spec.names[i] + "`: out_features must be positive");
      KILN_ASSIGN_OR_RETURN(Part p, read_part(source, spec.names[i], spec.in_features, spec.out_features[i]));
      parts.push_back(std::move(p));
    }
    return make_cpu_linear(std::move(parts), spec.in_features);
  }

  Result<std::unique_ptr<ExpertSet>> load_experts(const WeightSource& source, const ExpertSpec& spec) override {
    if (spec.num_experts <= 0)
      return invalid_argument("`" + spec.prefix + "`: num_experts must be positive, got " + std::to_string(spec.num_experts));
    if (dense_ && !source.synthetic() && experts_stored_dense(source, spec.prefix, spec.num_experts))
      return dense_->load_experts(source, spec);
    const int64_t H = spec.hidden, I = spec.intermediate;
    std::vector<ExpertLinears> experts;
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      const std::string base = spec.prefix + "." + std::to_string(e) + ".";
      ExpertLinears x;
      KILN_ASSIGN_OR_RETURN(x.gate, load_linear(source, one(base + "gate_proj", I, H)));
      KILN_ASSIGN_OR_RETURN(x.up, load_linear(source, one(base + "up_proj", I, H)));
      KILN_ASSIGN_OR_RETURN(x.down, load_linear(source, one(base + "down_proj", H, I)));
      experts.push_back(std::move(x));
    }
    return make_cpu_expert_set(spec.prefix, std::move(experts), H, I);
  }

 private:
  static LinearSpec one(const std::string& name, int64_t out, int64_t in) {
    LinearSpec s;
    s.names = {name};
    s.out_features = {out};
    s.in_features = in;
    return s;
  }

  WeightFormat* dense_;
};

// weights.bits and weights.experts_only shape the modules the format generates; a checkpoint's are as stored.
Status check_synthetic_keys(const CreateContext& ctx) {
  if (!ctx.section || !ctx.model || ctx.model->synthetic_weights) return ok_status();
  for (const char* key : {"bits", "experts_only"})
    if (ctx.section->has(key) && ctx.section->origin(key) != "default")
      return ctx.section->error(key, "applies to model.load = \"dummy\" only: a checkpoint's modules are EXL3 or "
                                     "dense as stored; remove it");
  return ok_status();
}

Result<std::unique_ptr<WeightFormat>> create_exl3_format(const CreateContext& ctx) {
  KILN_RETURN_IF_ERROR(check_synthetic_keys(ctx));
#if KILN_EXL3_WITH_CUDA
  if (ctx.device.is_cuda()) {
    if (!ctx.device_context)
      return failed_precondition("the `exl3` weight format on CUDA needs the core's device context");
    cuda::SyntheticModules synthetic;
    synthetic.bits = static_cast<int>(ctx.section ? ctx.section->get_int("bits", 4) : 4);
    synthetic.experts_only = ctx.section && ctx.section->get_bool("experts_only", false);
    if (synthetic.experts_only && !ctx.dense_weights)
      return failed_precondition("weights.experts_only: the dense modules need the built-in `dense` format, which "
                                 "this caller does not offer (CreateContext::dense_weights)");
    return cuda::make_cuda_weight_format(*ctx.device_context, ctx.dense_weights, synthetic);
  }
#endif
  if (!ctx.device.is_cpu())
    return unimplemented("this build of the `exl3` weight format has no CUDA kernels (built without nvcc); set "
                         "model.device = \"cpu\"");
  return std::unique_ptr<WeightFormat>(new Exl3CpuWeightFormat(ctx.dense_weights));
}

SectionSchema exl3_schema() {
#if KILN_EXL3_WITH_CUDA
  // Read only where the format makes weights itself (model.load = "dummy", on CUDA): a checkpoint's K is per tensor.
  KeySpec bits;
  bits.name = "bits";
  bits.type = ValueType::kInteger;
  bits.default_value = int64_t{4};
  bits.min = 1;
  bits.max = 8;
  bits.doc = "K (bits per weight) of the EXL3 modules generated for model.load = \"dummy\" (MCG codebook)";
  KeySpec experts_only;
  experts_only.name = "experts_only";
  experts_only.type = ValueType::kBool;
  experts_only.default_value = false;
  experts_only.doc = "model.load = \"dummy\": generate only the routed experts as EXL3 and every other linear as "
                     "dense bf16 through the built-in format, as `kiln quantize --experts-only` leaves a checkpoint";
  return {{bits, experts_only}};
#else
  return {};
#endif
}

Status register_exl3(Registrar& registrar) {
  KILN_RETURN_IF_ERROR(register_exl3_quantizer(registrar));
#if KILN_EXL3_WITH_CUDA
  const DeviceSet devices = DeviceSet::cpu_and_cuda();
#else
  const DeviceSet devices = DeviceSet::cpu();
#endif
  return registrar.add<WeightFormat>(
      "exl3", "EXL3 trellis-quantized linears and experts (K = 1..8, 3INST/MCG/MUL1; unquantized modules dense)",
      &create_exl3_format, devices, exl3_schema());
}

}  // namespace
}  // namespace kiln::exl3

KILN_PLUGIN("quant-exl3", "0.1.0", "EXL3 trellis-quantized weights (ExLlamaV3 format)", kiln::exl3::register_exl3)
