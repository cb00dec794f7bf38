// The plugins the CPU tests of kv-fp8mla load from the build tree, once per process: an inline function's static is
// one object across the test files of an executable, so no file loads a plugin a second time.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#include "plugin/plugin_loader.h"
#include "plugin/registry.h"

namespace kiln::fp8mla {

inline void load_plugins() {
  static const Status loaded = [] {
    PluginLoader loader(global_registry());
    const std::filesystem::path dir = std::filesystem::path(KILN_BINARY_DIR) / "lib/kiln/plugins";
    KILN_RETURN_IF_ERROR(loader.load_file(dir / "kiln-kv-fp8mla.so"));
    return loader.load_file(dir / "kiln-draft-mtp.so");
  }();
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
}

}  // namespace kiln::fp8mla
