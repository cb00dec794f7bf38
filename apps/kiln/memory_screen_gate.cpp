#include "memory_screen_gate.h"

#include <cstdio>

#include "plugin/registry.h"

namespace kiln::cli {

ScreenedRecipe screen_recipe(const Recipe& recipe, const std::string& what, std::ostream& out) {
  ScreenedRecipe s;
  out << "# screen: " << what << "\n";
  auto m = screen_memory(recipe, global_registry());
  if (!m.ok()) {
    // Not a verdict: loading goes on and reports whatever stops it.
    out << "# memory model: not computed (" << m.status().message() << ")\n" << std::flush;
    return s;
  }
  out << m->report("# ") << std::flush;
  if (m->judged && !m->go) {
    const double b = static_cast<double>(m->shortfall_bytes);
    char size[32];
    if (b >= (1 << 30))
      std::snprintf(size, sizeof size, "%.2f GiB", b / (1 << 30));
    else
      std::snprintf(size, sizeof size, "%.1f MiB", b / (1 << 20));
    s.refusal = what + ": the memory model says no-go, short by " + size +
                (m->reasons.empty() ? std::string() : ": " + m->reasons.front());
  }
  s.model = std::move(m).value();
  return s;
}

}  // namespace kiln::cli
