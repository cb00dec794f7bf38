// Registers kiln's built-in capabilities through the same Registrar plugins use, so the core never
// special-cases them: weight_format `dense`, kv_layout `bf16`, drafter `none`, collective `local`,
// modality `text`.
#pragma once

#include "kiln/plugin.h"

namespace kiln {

Status register_builtin_capabilities(Registrar& registrar);

}  // namespace kiln
