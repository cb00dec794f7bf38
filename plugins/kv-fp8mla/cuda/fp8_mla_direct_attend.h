// The direct form of fp8_ds_mla's tensor-core decode attention (fp8_mla_direct_attend.cu), as launch_tc_attend
// calls it: parameters already checked by cuda::mla_decode_check and direct_attend_takes.
#pragma once

#include "kiln/cuda/mla_decode_plan.h"

namespace kiln::fp8mla {

// KILN_FP8MLA_ATTEND=widened: the A/B switch back to the widened form.
bool direct_attend_forced_off();
const char* launch_direct_attend(const cuda::MlaDecodeParams& p, void* stream);

}  // namespace kiln::fp8mla
