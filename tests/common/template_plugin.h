// The plugin template (kiln-example.so: the n-gram drafter, the bf16-copy KV layout) loaded into the global
// registry once per process, whichever test file asks first (loading it twice is refused: its names exist).
#pragma once

#include <filesystem>

#include "plugin/plugin_loader.h"
#include "plugin/registry.h"

namespace kiln::testing {

inline const Status& template_plugin_loaded() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    return loader.load_file(std::filesystem::path(KILN_TEMPLATE_PLUGIN_DIR) / "kiln-example.so");
  }();
  return loaded;
}

}  // namespace kiln::testing
