#include "server/media_fetch.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <vector>

namespace kiln {
namespace {

struct Sink {
  std::vector<uint8_t>* bytes;
  int64_t limit;
  bool over = false;
};

size_t write_body(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t n = size * count;
  if (static_cast<int64_t>(sink->bytes->size() + n) > sink->limit) {
    sink->over = true;
    return 0;  // libcurl ends the transfer with CURLE_WRITE_ERROR
  }
  sink->bytes->insert(sink->bytes->end(), data, data + n);
  return n;
}

// The type the bytes announce, for responses without a usable Content-Type.
std::string sniff(const std::vector<uint8_t>& b) {
  auto starts = [&](const char* magic, size_t at = 0) {
    const size_t len = std::char_traits<char>::length(magic);
    if (b.size() < at + len) return false;
    for (size_t i = 0; i < len; ++i)
      if (b[at + i] != static_cast<unsigned char>(magic[i])) return false;  // char may be signed: compare bytes
    return true;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return "image/png";
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return "image/jpeg";
  if (starts("RIFF") && starts("WEBP", 8)) return "image/webp";
  return "";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

bool is_remote_url(const std::string& url) {
  const std::string head = lower(url.substr(0, 8));
  return head.rfind("http://", 0) == 0 || head.rfind("https://", 0) == 0;
}

std::optional<ApiError> fetch_remote_media(const std::string& url, const std::string& field,
                                           const RemoteMediaOptions& options, MediaItem& item) {
  const std::string url_field = field + ".image_url.url";
  if (!options.enabled)
    return bad_request(url_field + ": only data: URLs (\"data:image/png;base64,...\") are accepted; this server fetches "
                                   "nothing over the network (media.remote_urls = false)",
                       url_field);
  static std::once_flag global;
  std::call_once(global, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURL* curl = curl_easy_init();
  if (!curl) return ApiError{500, url_field + ": could not start an HTTP client", "server_error", url_field, ""};
  item.bytes.clear();
  Sink sink{&item.bytes, options.max_bytes};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 3L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options.timeout_ms));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM: the server is multithreaded
  curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(options.max_bytes));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "kiln");
  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  const char* type = nullptr;
  curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
  std::string content_type = type ? type : "";
  curl_easy_cleanup(curl);

  const std::string limit_mib = std::to_string(options.max_bytes >> 20) + " MiB";
  if (sink.over || rc == CURLE_FILESIZE_EXCEEDED)
    return bad_request(url_field + ": the image at " + url + " is larger than " + limit_mib + " (media.remote_max_mib)",
                       url_field);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return bad_request(url_field + ": fetching " + url + " took longer than " +
                           std::to_string(options.timeout_ms / 1000) + " s (media.remote_timeout_s)",
                       url_field);
  if (rc != CURLE_OK)
    return bad_request(url_field + ": fetching " + url + " failed: " + curl_easy_strerror(rc), url_field);
  if (status != 200)
    return bad_request(url_field + ": fetching " + url + " gave HTTP " + std::to_string(status), url_field);
  if (item.bytes.empty()) return bad_request(url_field + ": " + url + " returned no bytes", url_field);
  // "image/png; charset=..." → "image/png"; generic or missing types are sniffed from the bytes.
  content_type = lower(content_type.substr(0, content_type.find(';')));
  content_type.erase(std::remove_if(content_type.begin(), content_type.end(), [](char c) { return c == ' '; }),
                     content_type.end());
  if (content_type.empty() || content_type == "application/octet-stream" || content_type == "binary/octet-stream") {
    const std::string sniffed = sniff(item.bytes);
    if (!sniffed.empty()) content_type = sniffed;
  }
  if (content_type.empty())
    return bad_request(url_field + ": " + url + " has no Content-Type and its bytes are not PNG, JPEG or WebP",
                       url_field);
  item.mime_type = content_type;
  return std::nullopt;
}

}  // namespace kiln
