// The e4m3 codec is the SDK's (kiln/fp8_e4m3.h), shared with the core's fp8 DSA indexer keys; the layout's code
// names it in its own namespace.
#pragma once

#include "kiln/fp8_e4m3.h"

namespace kiln::fp8mla {

using kiln::e4m3_to_float;
using kiln::float_to_e4m3;
using kiln::kE4m3Max;

}  // namespace kiln::fp8mla
