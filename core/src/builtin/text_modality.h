// The built-in `text` modality: accepts no media.
#pragma once

#include <memory>

#include "kiln/modality.h"

namespace kiln::builtin {

Result<std::unique_ptr<Modality>> create_text_modality(const CreateContext& context);

}  // namespace kiln::builtin
