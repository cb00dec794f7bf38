#include "engine/speculative_drafter.h"

#include "recipe/drafter_settings.h"

namespace kiln {

Result<std::shared_ptr<Drafter>> create_drafter(const Recipe& recipe, const Registry& registry, const ModelInfo& info,
                                                DeviceContext& device, DraftServices* services) {
  const RecipeSection& spec = recipe.section("speculative");
  const std::string method = spec.get_string("method", "none");
  CreateContext ctx;
  ctx.section = &spec;
  ctx.device = device.device();
  ctx.device_context = &device;
  ctx.model = &info;
  ctx.draft_services = services;
  auto made = registry.create<Drafter>(method, ctx);
  const std::string where = "`speculative.method = \"" + method + "\"` (" + spec.origin("method") + ")";
  if (!made.ok()) return made.status().with_context(where);
  // No key without an effect: a draft checkpoint is read only by drafters that load one, a draft KV dtype only by
  // drafters with caches of their own.
  const std::vector<Status> problems = check_drafter_settings(spec, (*made)->capabilities());
  if (!problems.empty()) return problems.front();
  return std::move(made).value();
}

}  // namespace kiln
