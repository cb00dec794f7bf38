// transport.env: NCCL settings a recipe carries (NCCL_P2P_DISABLE, NCCL_CUMEM_ENABLE, ...), put into the process
// environment before NCCL first reads it. Only NCCL_* names are taken: the table is not a way to set arbitrary
// variables of the server process.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/recipe.h"
#include "kiln/status.h"

namespace kiln::nccl {

// Refuses a name that is not NCCL_[A-Z0-9_]+ or a value with a NUL byte, naming the key.
Status check_nccl_env(const StringTable& settings);

struct EnvChange {
  std::string name, value;
  std::optional<std::string> kept;  // set: the process already had this other value, which stays
};

// What applying `settings` does given the current environment: a variable the process environment already sets
// to another value keeps it (so `NCCL_DEBUG=INFO kiln serve ...` overrides a recipe for one run).
std::vector<EnvChange> plan_nccl_env(const StringTable& settings,
                                     const std::function<std::optional<std::string>(const std::string&)>& current);

// check, plan against the process environment, setenv, and one log line per variable kept from the environment.
Status apply_nccl_env(const StringTable& settings);

}  // namespace kiln::nccl
