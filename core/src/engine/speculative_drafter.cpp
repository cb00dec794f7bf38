#include "engine/speculative_drafter.h"

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
  // No key without an effect: a draft checkpoint is read only by drafters that load one.
  const bool has_draft_model = !spec.get_string("draft_model").empty();
  const DrafterCapabilities caps = (*made)->capabilities();
  if (has_draft_model && !caps.needs_draft_model)
    return spec.error("draft_model", "the drafter `" + method + "` loads no checkpoint of its own; remove the key");
  if (!has_draft_model && caps.needs_draft_model)
    return spec.error("draft_model", "the drafter `" + method + "` needs a draft checkpoint directory; set it");
  return std::move(made).value();
}

}  // namespace kiln
