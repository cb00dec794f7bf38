// Images for `kiln bench serve --images N --image-size S`: PNGs of random content, one per image of each request, sent
// as data: URLs in chat completions' image_url parts.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kiln::cli {

// A size × size RGB PNG (libpng) of random colours in 8×8 blocks: content no other request shares (so neither the
// modality's encode cache nor prefix caching answers for it), compressing to about a photo's JPEG size rather than
// the 3 bytes per pixel of per-pixel noise, which would time the JSON body instead of the image path.
std::vector<uint8_t> random_png(int64_t size, std::mt19937_64& rng);

// "data:image/png;base64,..." for PNG bytes.
std::string png_data_url(const std::vector<uint8_t>& png);

}  // namespace kiln::cli
