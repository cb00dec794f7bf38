// The checkpoint's preprocessor_config.json applied to the image processor, as AutoImageProcessor would load it:
// the canvas budget (min/max_image_tokens) and CLIP mean/std it may override; patch, temporal and merge sizes that
// must equal the vision tower's; the steps kiln always takes (resize bicubic, rescale 1/255, normalise, RGB) refused
// if the file turns them off. No file: Glm5NextImageProcessor's defaults.
#pragma once

#include <filesystem>

#include "image_canvas.h"
#include "kiln/status.h"
#include "vision_config.h"

namespace kiln::vision {

Result<ImageProcessorConfig> processor_settings(const std::filesystem::path& dir, const VisionConfig& vision);

}  // namespace kiln::vision
