// The architectures kiln runs: one line each. Each entry's folder (model/arch/<model_type>/) holds its parse
// function and whatever is its own; shared blocks live beside the registry.
#include "model/arch/architecture.h"
#include "model/arch/deepseek_v3/deepseek_v3.h"
#include "model/arch/glm4_moe_lite/glm4_moe_lite.h"
#include "model/arch/glm5_next/glm5_next.h"
#include "model/arch/glm_moe_dsa/glm_moe_dsa.h"

namespace kiln {

const std::vector<ArchitectureEntry>& architectures() {
  static const std::vector<ArchitectureEntry> entries = {
      {"deepseek_v3", "DeepSeek-V3: MLA (YaRN rope) + grouped-router MoE, MTP", &arch::parse_deepseek_v3},
      {"glm4_moe_lite", "GLM-4.7-Flash: MLA + MoE with a shared expert, MTP", &arch::parse_glm4_moe_lite},
      {"glm_moe_dsa", "GLM-5: MLA with DSA sparse attention (lightning indexer) + MoE, MTP", &arch::parse_glm_moe_dsa},
      {"glm5_next", "GLM-5.3-Flash: mHC streams, KDA linear attention + NoPE DSA (pooled indexer), clamped MoE (CPU)",
       &arch::parse_glm5_next},
  };
  return entries;
}

}  // namespace kiln
