#include "recipe/drafter_settings.h"

#include "recipe/core_schema.h"

namespace kiln {

std::vector<Status> check_drafter_settings(const RecipeSection& speculative, const DrafterCapabilities& caps) {
  std::vector<Status> problems;
  const std::string drafter = "the drafter `" + speculative.get_string("method", "none") + "`";
  const bool has_draft_model = !speculative.get_string("draft_model").empty();
  if (has_draft_model && !caps.needs_draft_model)
    problems.push_back(speculative.error("draft_model", drafter + " loads no checkpoint of its own; remove the key"));
  if (!has_draft_model && caps.needs_draft_model)
    problems.push_back(speculative.error("draft_model", drafter + " needs a draft checkpoint directory; set it"));

  const KeySpec* dtype = find_core_section("speculative")->schema.find("draft_kv_dtype");
  const std::string default_dtype = std::get<std::string>(*dtype->default_value);
  const std::string chosen = speculative.get_string("draft_kv_dtype", default_dtype);
  if (chosen != default_dtype && caps.cache_layers.empty())
    problems.push_back(speculative.error(
        "draft_kv_dtype", "\"" + chosen + "\": " + drafter +
                              " keeps no KV cache of its own (what it caches follows the target's kv.layout), so "
                              "nothing would be stored in " +
                              chosen + "; remove the key"));
  return problems;
}

}  // namespace kiln
