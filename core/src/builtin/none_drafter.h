// The built-in `none` drafter: speculative decoding off. It advertises max_depth 0 and refuses to propose.
#pragma once

#include <memory>

#include "kiln/drafter.h"

namespace kiln::builtin {

Result<std::unique_ptr<Drafter>> create_none_drafter(const CreateContext& context);

}  // namespace kiln::builtin
