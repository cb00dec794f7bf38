// What every `kiln` subcommand shares: logging flags, plugin discovery flags, and loading them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "plugin/plugin_loader.h"

namespace kiln::cli {

namespace po = boost::program_options;

struct CommonOptions {
  std::string log_level;                 // empty = KILN_LOG_LEVEL or "info"
  std::vector<std::string> plugin_dirs;  // --plugin-dir, searched first
};

// Adds --log-level and --plugin-dir to a subcommand's options.
void add_common_options(po::options_description& desc, CommonOptions& opts);

// Configures spdlog from --log-level, else KILN_LOG_LEVEL, else info. Returns false on an unknown level.
bool setup_logging(const CommonOptions& opts);

// Loads plugins from the search path into the global registry (built-ins are already there).
PluginLoader& load_plugins(const CommonOptions& opts);

// Parses argv for a subcommand; prints the error or help. Returns -1 to continue, else the exit code.
int parse_or_exit(int argc, char** argv, const po::options_description& desc, const po::positional_options_description& pos,
                  po::variables_map& vm, const std::string& usage);

int fail(const std::string& message);

// "1,4,16" or "4K,32K" (K = 1024) as integers; throws std::invalid_argument / std::out_of_range on anything else.
std::vector<int64_t> parse_int_list(const std::string& text);

}  // namespace kiln::cli
