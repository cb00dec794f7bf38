#include "builtin/register_builtins.h"
#include "kiln/log.h"
#include "plugin/registry.h"
#include "plugin/staging_registrar.h"

namespace kiln {

Registry& global_registry() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never destroyed: plugin objects may still be released during static destruction
    StagingRegistrar staging("builtin", KILN_VERSION, "", nullptr);
    Status s = register_builtin_capabilities(staging);
    if (s.ok()) s = r->add_all(std::move(staging.entries()));
    if (!s.ok()) log::error("built-in capabilities failed to register: {}", s.to_string());
    return r;
  }();
  return *registry;
}

}  // namespace kiln
