// The recipe sections the core owns, their keys, and which key of a section selects the plugin that
// owns the rest of it (kv.layout → a kv_layout; its schema adds keys to [kv]).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/recipe.h"

namespace kiln {

// A key of a selector section that belongs to a kind of plugin kiln does not have yet: no loaded plugin declares it,
// so it is refused, and the message says what would give it an effect.
struct UnprovidedKey {
  std::string name;
  std::string doc;      // what it would configure
  std::string missing;  // what would give it an effect: "no collective plugin providing NCCL is loaded (...)"
};

struct CoreSection {
  std::string name;
  std::string doc;
  SectionSchema schema;
  std::optional<std::string> selector_key;  // e.g. "layout" in [kv]
  PluginKind selector_kind = PluginKind::kWeightFormat;
  std::vector<UnprovidedKey> unprovided = {};
};

const std::vector<CoreSection>& core_sections();
const CoreSection* find_core_section(const std::string& name);
// The key `name` of `section` when it is one nobody provides yet, else null.
const UnprovidedKey* find_unprovided_key(const CoreSection& section, const std::string& name);

}  // namespace kiln
