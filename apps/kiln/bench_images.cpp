#include "bench_images.h"

#include <openssl/evp.h>
#include <png.h>

#include <cstring>
#include <stdexcept>

namespace kiln::cli {

std::vector<uint8_t> random_png(int64_t size, std::mt19937_64& rng) {
  constexpr int64_t kBlock = 8;
  const int64_t blocks = (size + kBlock - 1) / kBlock;
  std::vector<uint8_t> colours(static_cast<size_t>(blocks * blocks * 3));
  for (uint8_t& c : colours) c = static_cast<uint8_t>(rng());
  std::vector<uint8_t> rgb(static_cast<size_t>(size * size * 3));
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x)
      std::memcpy(&rgb[static_cast<size_t>((y * size + x) * 3)],
                  &colours[static_cast<size_t>(((y / kBlock) * blocks + x / kBlock) * 3)], 3);

  // libpng's simplified API: the first call sizes the buffer, the second writes into it.
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(size);
  image.height = static_cast<png_uint_32>(size);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t bytes = 0;
  if (!png_image_write_to_memory(&image, nullptr, &bytes, 0, rgb.data(), 0, nullptr))
    throw std::runtime_error(std::string("libpng: ") + image.message);
  std::vector<uint8_t> png(bytes);
  if (!png_image_write_to_memory(&image, png.data(), &bytes, 0, rgb.data(), 0, nullptr))
    throw std::runtime_error(std::string("libpng: ") + image.message);
  png.resize(bytes);
  return png;
}

std::string png_data_url(const std::vector<uint8_t>& png) {
  std::string b64(4 * ((png.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()), png.data(), static_cast<int>(png.size()));
  b64.resize(static_cast<size_t>(n));
  return "data:image/png;base64," + b64;
}

}  // namespace kiln::cli
