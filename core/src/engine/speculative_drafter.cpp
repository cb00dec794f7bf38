#include "engine/speculative_drafter.h"

namespace kiln {

Result<std::shared_ptr<Drafter>> create_drafter(const Recipe& recipe, const Registry& registry, const ModelInfo& info,
                                                DraftHost* host) {
  const RecipeSection& spec = recipe.section("speculative");
  const std::string method = spec.get_string("method", "none");
  CreateContext ctx;
  ctx.section = &spec;
  ctx.device = Device::cpu();
  ctx.model = &info;
  ctx.draft_host = host;
  auto made = registry.create<Drafter>(method, ctx);
  if (!made.ok())
    return made.status().with_context("`speculative.method = \"" + method + "\"` (" + spec.origin("method") + ")");
  return std::move(made).value();
}

}  // namespace kiln
