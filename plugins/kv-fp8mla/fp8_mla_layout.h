// The `fp8_ds_mla` KV layout's halves: one factory per device, over the row format of fp8_mla_row.h.
#pragma once

#include <memory>

#include "kiln/kv_layout.h"

namespace kiln::fp8mla {

std::unique_ptr<KvLayout> make_cpu_layout(const KvGeometry& g);
#ifdef KV_FP8MLA_WITH_CUDA
std::unique_ptr<KvLayout> make_cuda_layout(const KvGeometry& g, Device device);
#endif

}  // namespace kiln::fp8mla
