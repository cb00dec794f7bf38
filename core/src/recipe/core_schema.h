// The recipe sections the core owns, their keys, and which key of a section selects the plugin that
// owns the rest of it (kv.layout → a kv_layout; its schema adds keys to [kv]).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/recipe.h"

namespace kiln {

struct CoreSection {
  std::string name;
  std::string doc;
  SectionSchema schema;
  std::optional<std::string> selector_key;  // e.g. "layout" in [kv]
  PluginKind selector_kind = PluginKind::kWeightFormat;
};

const std::vector<CoreSection>& core_sections();
const CoreSection* find_core_section(const std::string& name);

}  // namespace kiln
