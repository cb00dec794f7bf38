// Remote image URLs (http:// and https://) for media parts, fetched with libcurl when the recipe allows them
// (media.remote_urls): off by default, because a server that fetches what clients name can be pointed at hosts
// only it can reach. When on: http and https only (redirects too, at most 3), a size limit (media.remote_max_mib,
// checked against Content-Length and while receiving) and a whole-transfer timeout (media.remote_timeout_s). The
// MIME type is the response's Content-Type, or sniffed from the bytes (PNG, JPEG, WebP) when it is missing or
// generic. Every failure is a 400 naming the part's field and saying what went wrong.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kiln/modality.h"
#include "server/api_error.h"

namespace kiln {

struct RemoteMediaOptions {
  bool enabled = false;            // media.remote_urls
  int64_t max_bytes = 20 << 20;    // media.remote_max_mib
  int64_t timeout_ms = 10'000;     // media.remote_timeout_s
};

// True for http:// and https:// URLs (case-insensitive scheme).
bool is_remote_url(const std::string& url);

// Fetches `url` into `item` (bytes and MIME type); an error names `field` + ".image_url.url".
std::optional<ApiError> fetch_remote_media(const std::string& url, const std::string& field,
                                           const RemoteMediaOptions& options, MediaItem& item);

}  // namespace kiln
