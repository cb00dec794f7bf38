#include "cli_common.h"

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "plugin/registry.h"

namespace kiln::cli {

void add_common_options(po::options_description& desc, CommonOptions& opts) {
  desc.add_options()
      ("log-level", po::value(&opts.log_level), "trace, debug, info, warn, error, off (default: $KILN_LOG_LEVEL or info)")
      ("plugin-dir", po::value(&opts.plugin_dirs)->composing(), "directory to search for plugins first (repeatable)");
}

bool setup_logging(const CommonOptions& opts) {
  std::string level = opts.log_level;
  if (level.empty())
    if (const char* env = std::getenv("KILN_LOG_LEVEL")) level = env;
  if (level.empty()) level = "info";
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    std::cerr << "kiln: unknown log level `" << level << "` (trace, debug, info, warn, error, off)\n";
    return false;
  }
  // Logs go to stderr so that generated text on stdout stays clean to pipe.
  auto logger = spdlog::stderr_color_mt("kiln");
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  return true;
}

PluginLoader& load_plugins(const CommonOptions& opts) {
  static PluginLoader loader(global_registry());
  static bool done = false;
  if (!done) {
    if (Status s = check_plugin_dirs(opts.plugin_dirs); !s.ok()) std::exit(fail(s.message()));
    loader.load_search_path(plugin_search_path(opts.plugin_dirs));
    done = true;
  }
  return loader;
}

int parse_or_exit(int argc, char** argv, const po::options_description& desc, const po::positional_options_description& pos,
                  po::variables_map& vm, const std::string& usage) {
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "kiln: " << e.what() << "\n\n" << usage << "\n(see --help)\n";
    return 2;
  }
  return -1;
}

int fail(const std::string& message) {
  std::cerr << "kiln: " << message << "\n";
  return 1;
}

std::vector<int64_t> parse_int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t mult = 1;
    if (item.back() == 'K' || item.back() == 'k') {
      mult = 1024;
      item.pop_back();
    }
    size_t used = 0;
    const int64_t v = std::stoll(item, &used);
    if (used != item.size()) throw std::invalid_argument("`" + item + "` is not an integer");
    out.push_back(v * mult);
  }
  return out;
}

}  // namespace kiln::cli
