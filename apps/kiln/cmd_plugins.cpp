// `kiln plugins`: what loaded, what each provides (with its recipe keys), and why any file was refused.
#include <iostream>

#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "commands.h"
#include "plugin/registry.h"

namespace kiln::cli {

int cmd_plugins(int argc, char** argv) {
  CommonOptions common;
  po::options_description desc("kiln plugins options");
  bool verbose = false;
  desc.add_options()("help,h", "show this help")("verbose,v", po::bool_switch(&verbose),
                                                    "also list each capability's devices and recipe keys");
  add_common_options(desc, common);
  po::variables_map vm;
  int rc = parse_or_exit(argc, argv, desc, {}, vm,
                         "usage: kiln plugins [--plugin-dir DIR]... [--verbose]\n"
                         "Lists built-in capabilities, loaded plugins and refused files.");
  if (rc >= 0) return rc;
  if (!setup_logging(common)) return 2;
  // Refusals are reported below, in full, rather than as warnings interleaved with the listing.
  if (common.log_level.empty()) spdlog::set_level(spdlog::level::err);
  PluginLoader& loader = load_plugins(common);
  const Registry& reg = global_registry();

  std::cout << "search path:\n";
  for (const auto& d : plugin_search_path(common.plugin_dirs)) std::cout << "  " << d.string() << "\n";

  std::cout << "\ncapabilities:\n";
  for (int k = 0; k < kNumPluginKinds; ++k) {
    auto kind = static_cast<PluginKind>(k);
    for (const auto* e : reg.list(kind)) {
      std::cout << "  " << plugin_kind_name(kind) << " " << e->name << "  [" << e->provider
                << (e->provider_version.empty() ? "" : " " + e->provider_version) << "]  " << e->description << "\n";
      if (verbose) std::cout << "      devices: " << e->devices.to_string() << "\n";
      if (verbose)
        for (const auto& key : e->schema.keys)
          std::cout << "      " << key.name << " (" << value_type_name(key.type) << ")  " << key.doc << "\n";
    }
  }

  std::cout << "\nplugins loaded: " << loader.loaded().size() << "\n";
  for (const auto& p : loader.loaded()) {
    std::cout << "  " << p.name << " " << p.version << " (ABI " << p.abi_major << "." << p.abi_minor << ")  " << p.path
              << "\n    " << p.description << "\n    provides:";
    for (const auto& [kind, name] : p.provides) std::cout << " " << plugin_kind_name(kind) << "/" << name;
    std::cout << "\n";
  }
  if (!loader.refused().empty()) {
    std::cout << "\nfiles refused: " << loader.refused().size() << "\n";
    for (const auto& r : loader.refused()) std::cout << "  " << r.path << "\n    " << r.reason << "\n";
  }
  return 0;
}

}  // namespace kiln::cli
