// The tensor names of a glm5_next checkpoint. Loaders ask for transformers' in-memory names under the trunk's
// prefix (`model.language_model.` in transformers' checkpoints, `model.` in the original release's flat ones) and
// for per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight`; this source finds each under whichever name the
// checkpoint uses (specs/glm5-next.md §7):
//   self_attn.forget_gate.{f_a_proj, f_b_proj, dt_bias, A_log} ↔ self_attn.{f_a_proj, f_b_proj, dt_bias, A_log}
//   attn_hc.{fn, base, scale} / ffn_hc.*                        ↔ hc_attn_{fn, base, scale} / hc_ffn_*
//   mlp.experts.{e}.{gate,up}_proj.weight ↔ rows of the stacked mlp.experts.gate_up_proj [E, 2I, H]
//   mlp.experts.{e}.down_proj.weight      ↔ mlp.experts.down_proj [E, H, I]
// (views into the stored tensors: nothing is copied). The short conv's q/k/v_conv1d vs conv1d is the loader's:
// it concatenates.
#pragma once

#include <string>
#include <vector>

#include "kiln/weight_format.h"

namespace kiln::glm5_next {

class Glm5NextTensorNames final : public WeightSource {
 public:
  explicit Glm5NextTensorNames(const WeightSource& stored) : stored_(stored) {}

  // "model.language_model." when the checkpoint has transformers' names, else "model." (the flat original form).
  std::string trunk_prefix() const;
  bool has(const std::string& name) const override;
  // A missing tensor's error names it and the original name it was also looked for under.
  Result<TensorView> get(const std::string& name) const override;
  // A synthetic source (model.load = "dummy") stays synthetic through the renaming.
  bool synthetic() const override { return stored_.synthetic(); }
  uint64_t seed() const override { return stored_.seed(); }

 private:
  // The names `name` may be stored under, in the order they are tried.
  std::vector<std::string> aliases(const std::string& name) const;
  const WeightSource& stored_;
};

}  // namespace kiln::glm5_next
