// The built-in `local` collective: a tensor-parallel group of one rank. Reductions and broadcasts are
// no-ops; gathers and scatters copy. Copies run on the CPU only for now.
#pragma once

#include <memory>

#include "kiln/collective.h"

namespace kiln::builtin {

Result<std::unique_ptr<Collective>> create_local_collective(const CreateContext& context);

}  // namespace kiln::builtin
