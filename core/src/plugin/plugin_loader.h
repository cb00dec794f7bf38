// Finds plugin libraries, checks their ABI handshake and registers what they provide.
// Every refusal is recorded with its reason (for `kiln plugins`) instead of aborting: one bad file never
// stops the others from loading. Libraries stay loaded for the life of the process.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "plugin/registry.h"

namespace kiln {

struct LoadedPlugin {
  std::string path;
  std::string name;
  std::string version;
  std::string description;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<std::pair<PluginKind, std::string>> provides;
};

struct RefusedPlugin {
  std::string path;
  std::string reason;
};

// Where plugins are looked for, in order: --plugin-dir values, KILN_PLUGIN_PATH (':'-separated),
// <install prefix>/lib/kiln/plugins, <exe dir>/../lib/kiln/plugins, the executable's own directory.
std::vector<std::filesystem::path> plugin_search_path(const std::vector<std::string>& cli_dirs);

// --plugin-dir names directories the user asked for: unlike the rest of the search path, one that does not exist
// is an error (a typo would otherwise load nothing, silently).
Status check_plugin_dirs(const std::vector<std::string>& cli_dirs);

// A candidate plugin file: kiln-<name>.so (what kiln_add_plugin produces).
bool is_plugin_file_name(const std::filesystem::path& p);

class PluginLoader {
 public:
  explicit PluginLoader(Registry& registry) : registry_(registry) {}

  // Loads every candidate in each directory (missing directories are skipped silently, as search paths are).
  void load_search_path(const std::vector<std::filesystem::path>& dirs);
  void load_directory(const std::filesystem::path& dir);
  // Loads one file; on refusal records it and returns the reason.
  Status load_file(const std::filesystem::path& file);

  const std::vector<LoadedPlugin>& loaded() const { return loaded_; }
  const std::vector<RefusedPlugin>& refused() const { return refused_; }
  const std::vector<std::filesystem::path>& searched() const { return searched_; }

 private:
  Status try_load(const std::filesystem::path& file);

  Registry& registry_;
  std::vector<LoadedPlugin> loaded_;
  std::vector<RefusedPlugin> refused_;
  std::vector<std::filesystem::path> searched_;
};

}  // namespace kiln
