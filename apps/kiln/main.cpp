// The `kiln` command: dispatches to subcommands, each with its own options and --help.
#include <cstring>
#include <iostream>
#include <string>

#include "build_info.h"
#include "commands.h"
#include "kiln/plugin.h"

namespace {

constexpr const char* kUsage =
    "usage: kiln <command> [options]\n"
    "\n"
    "commands:\n"
    "  plugins             list built-in capabilities, loaded plugins and refused files\n"
    "  recipe check FILE   validate a recipe (--set section.key=value to override keys)\n"
    "  recipe show FILE    print the fully resolved recipe as TOML\n"
    "  ab RECIPE --a k=v --b k=v   A/B two variants, interleaved; writes a result card\n"
    "  qualify RECIPE [--against INCUMBENT]   gates, sweeps and capacity over HTTP; a result card, evidence, a decision\n"
    "  serve RECIPE        the OpenAI-compatible server (chat, completions, responses, metrics)\n"
    "  bench serve|depth   measure a running server: concurrency sweep, context-depth sweep\n"
    "  bench decode|prefill RECIPE   time the recipe's model in-process against its roofline\n"
    "  quantize --bits K IN OUT   quantize an HF checkpoint into a weight format (exl3) from its plugin\n"
    "  generate            stream a completion: --recipe FILE (or --model DIR) --prompt TEXT | --chat TEXT\n"
    "\n"
    "options:\n"
    "  -h, --help          show this help (kiln <command> --help for a command's options)\n"
    "  --version           print kiln's version and plugin ABI\n";

struct Command {
  const char* name;
  int (*run)(int, char**);
};

constexpr Command kCommands[] = {
    {"plugins", kiln::cli::cmd_plugins},
    {"recipe", kiln::cli::cmd_recipe},
    {"generate", kiln::cli::cmd_generate},
    {"bench", kiln::cli::cmd_bench},
    {"ab", kiln::cli::cmd_ab},
    {"serve", kiln::cli::cmd_serve},
    {"quantize", kiln::cli::cmd_quantize},
    {"qualify", kiln::cli::cmd_qualify},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::cout << "kiln " KILN_VERSION " (plugin ABI " << KILN_ABI_MAJOR << "." << KILN_ABI_MINOR << ", " KILN_ABI_TAG
              << "; commit " << kiln::build_commit() << ")\n";
    return 0;
  }
  for (const auto& c : kCommands)
    if (std::string(argv[1]) == c.name) return c.run(argc - 1, argv + 1);
  std::cerr << "kiln: unknown command `" << argv[1] << "`\n\n" << kUsage;
  return 2;
}
