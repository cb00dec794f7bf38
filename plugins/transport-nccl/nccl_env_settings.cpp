#include "nccl_env_settings.h"

#include <cstdlib>

#include "kiln/log.h"
#include "kiln/launch_env.h"

namespace kiln::nccl {

Status check_nccl_env(const StringTable& settings) {
  for (const auto& [name, value] : settings) {
    bool well_formed = name.size() > 5 && name.rfind("NCCL_", 0) == 0;
    for (char c : name)
      if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) well_formed = false;
    if (!well_formed)
      return invalid_argument("`" + name +
                              "` is not an NCCL setting: only NCCL_ names (capitals, digits, _) are applied from the "
                              "recipe; set other variables in the environment that starts kiln");
    if (value.find('\0') != std::string::npos)
      return invalid_argument("the value of `" + name + "` contains a NUL byte");
  }
  return ok_status();
}

std::vector<EnvChange> plan_nccl_env(const StringTable& settings,
                                     const std::function<std::optional<std::string>(const std::string&)>& current) {
  std::vector<EnvChange> plan;
  for (const auto& [name, value] : settings) {
    EnvChange c{name, value, std::nullopt};
    if (auto now = current(name); now && *now != value) c.kept = *now;
    plan.push_back(std::move(c));
  }
  return plan;
}

Status apply_nccl_env(const StringTable& settings) {
  KILN_RETURN_IF_ERROR(check_nccl_env(settings));
  for (const EnvChange& c : plan_nccl_env(settings, process_env())) {
    if (c.kept) {
      log::warn("transport.env.{} = \"{}\" not applied: the environment already sets {}=\"{}\"", c.name, c.value,
                c.name, *c.kept);
      continue;
    }
    if (::setenv(c.name.c_str(), c.value.c_str(), 1) != 0) return internal_error("setenv(" + c.name + ") failed");
  }
  return ok_status();
}

}  // namespace kiln::nccl
