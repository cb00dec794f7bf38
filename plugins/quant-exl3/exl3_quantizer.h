// The `exl3` quantizer (kiln/quantizer.h): the encoder of exl3_encoder.h behind the SDK seam, registered by the
// plugin beside the weight format.
#pragma once

#include "kiln/plugin.h"

namespace kiln::exl3 {

Status register_exl3_quantizer(Registrar& registrar);

}  // namespace kiln::exl3
