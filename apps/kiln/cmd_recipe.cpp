// `kiln recipe check|show FILE [--set section.key=value]...`
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine_factory.h"
#include "engine/memory_model.h"
#include "model/model_loader.h"
#include "recipe/core_schema.h"
#include "recipe/recipe.h"
#include "recipe/recipe_check.h"

namespace kiln::cli {
namespace {

std::string default_text(const KeySpec& k) {
  if (k.required) return "required";
  if (!k.default_value) return "";
  return render_recipe_value(*k.default_value);
}

void print_key(const std::string& section, const KeySpec& k, const std::string& owner) {
  std::string doc = k.doc;
  if (!k.allowed.empty()) {
    doc += " (";
    for (size_t i = 0; i < k.allowed.size(); ++i) doc += (i ? ", " : "") + k.allowed[i];
    doc += ")";
  }
  std::cout << "| `" << section << "." << k.name << "` | " << value_type_name(k.type) << " | " << default_text(k) << " | "
            << owner << " | " << doc << " |\n";
}

// Markdown documentation of every key: the core's and those of each loaded plugin (configs/README.md).
void print_keys() {
  for (const auto& sec : core_sections()) {
    std::cout << "\n### [" << sec.name << "] — " << sec.doc << "\n\n| key | type | default | owner | meaning |\n|---|---|---|---|---|\n";
    for (const auto& k : sec.schema.keys) print_key(sec.name, k, "core");
    if (!sec.selector_key) continue;
    for (const auto* e : global_registry().list(sec.selector_kind))
      for (const auto& k : e->schema.keys)
        if (!sec.schema.find(k.name)) print_key(sec.name, k, std::string(plugin_kind_name(sec.selector_kind)) + " `" + e->name + "`");
    for (const auto& u : sec.unprovided) {
      bool provided = false;
      for (const auto* e : global_registry().list(sec.selector_kind)) provided = provided || e->schema.find(u.name);
      if (!provided)
        std::cout << "\n`" << sec.name << "." << u.name << "` (" << u.doc << ") is refused: " << u.missing << ".\n";
    }
  }
}

// Notes, then the verdict: ok, or every problem (and a non-zero exit).
int report_check(const std::string& file, const RecipeCheck& check) {
  for (const auto& note : check.notes) std::cout << "note: " << note << "\n";
  std::cout.flush();  // before the problems on stderr, for a reader of both
  if (check.ok()) {
    std::cout << file << ": ok";
    if (check.recipe->sources.size() > 1) std::cout << " (extends " << check.recipe->sources.size() - 1 << " file(s))";
    std::cout << "\n";
    return 0;
  }
  std::cerr << file << ": " << check.problems.size() << (check.problems.size() == 1 ? " problem" : " problems") << "\n";
  for (const auto& p : check.problems) std::cerr << "  " << p.message() << "\n";
  return 1;
}

}  // namespace

int cmd_recipe(int argc, char** argv) {
  CommonOptions common;
  std::string action, file;
  std::vector<std::string> sets;
  double device_memory_gib = 0;
  po::options_description desc("kiln recipe options");
  desc.add_options()
      ("help,h", "show this help")
      ("action", po::value(&action), "check | show")
      ("recipe", po::value(&file), "recipe file (TOML)")
      ("set", po::value(&sets)->composing(), "override one key: section.key=value (repeatable)")
      ("device-memory-gib", po::value(&device_memory_gib),
       "show: screen the memory model against this much device memory (CUDA) or RAM (CPU), GiB, instead of this "
       "machine's");
  add_common_options(desc, common);
  po::positional_options_description pos;
  pos.add("action", 1).add("recipe", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: kiln recipe check FILE [--set section.key=value]...\n"
      "       kiln recipe show  FILE [--set section.key=value]... [--device-memory-gib N]\n"
      "       kiln recipe keys\n"
      "check validates the recipe against the schemas of the core and of the plugins it selects and verifies\n"
      "  what can be known before load (model path and config, device, selected plugins), reporting every problem;\n"
      "show prints the memory model's interval and go / no-go, the KV capacity and the fully resolved recipe\n"
      "  (extends, overrides and defaults applied) as TOML;\n"
      "keys prints every key the core and the loaded plugins accept, as markdown.";
  int rc = parse_or_exit(argc, argv, desc, pos, vm, usage);
  if (rc >= 0) return rc;
  if (action == "keys") {
    if (!setup_logging(common)) return 2;
    load_plugins(common);
    print_keys();
    return 0;
  }
  if (action != "check" && action != "show") {
    std::cerr << "kiln recipe: expected `check`, `show` or `keys`" << (action.empty() ? "" : ", got `" + action + "`") << "\n"
              << usage << "\n";
    return 2;
  }
  if (file.empty()) {
    std::cerr << "kiln recipe " << action << ": missing FILE\n" << usage << "\n";
    return 2;
  }
  if (!setup_logging(common)) return 2;
  load_plugins(common);
  if (action == "check") return report_check(file, check_recipe_file(file, sets, global_registry()));
  auto recipe = load_recipe(file, sets, global_registry());
  if (!recipe.ok()) return fail(recipe.status().message());
  // show: the feasibility screen (before anything is loaded), then the KV capacity this recipe gets on this
  // machine, when its model can be loaded here.
  ScreenOptions screen_options;
  screen_options.memory_bytes = static_cast<uint64_t>(device_memory_gib * 1073741824.0);
  auto screen = screen_memory(*recipe, global_registry(), screen_options);
  if (screen.ok())
    std::cout << screen->report("# ");
  else
    std::cout << "# memory model: not computed (" << screen.status().message() << ")\n";
  if (screen.ok() && screen->judged && !screen->go) {
    std::cout << "# KV cache: not planned (the memory model says no-go)\n" << recipe->to_toml();
    return 0;
  }
  auto model = load_model(*recipe, global_registry(), model_load_options(*recipe));
  if (model.ok()) {
    auto plan = plan_recipe(*model, *recipe);
    std::cout << "# " << (plan.ok() ? plan->capacity.report() : "KV cache: " + plan.status().message()) << "\n";
  } else {
    std::cout << "# KV cache: not planned (" << model.status().message() << ")\n";
  }
  std::cout << recipe->to_toml();
  return 0;
}

}  // namespace kiln::cli
