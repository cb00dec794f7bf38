// The `dflash` / `dflash2` drafters on a CUDA device (DflashCudaModel runs the forward).
#pragma once

#include <memory>
#include <string>

#include "dflash_config.h"
#include "dflash_model.h"
#include "dflash_weights.h"
#include "kiln/draft_services.h"
#include "kiln/drafter.h"

namespace kiln::dflash {

Result<std::unique_ptr<Drafter>> make_cuda_drafter(DraftServices& services, const WeightSource& source,
                                                   DflashConfig config, const DflashWeights& weights, KvDtype kv,
                                                   std::string name);

}  // namespace kiln::dflash
