#include "qualify_evidence.h"

#include <openssl/evp.h>

#include <array>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "plugin/registry.h"

namespace kiln::cli {
namespace {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }
  void update(const char* data, size_t n) { EVP_DigestUpdate(ctx_.get(), data, n); }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), md, &n);
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < n; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 15];
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

}  // namespace

std::string sha256_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  Sha256 h;
  std::array<char, 1 << 16> buf;
  while (in) {
    in.read(buf.data(), buf.size());
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex();
}

std::string sha256_text(const std::string& text) {
  Sha256 h;
  h.update(text.data(), text.size());
  return h.hex();
}

nlohmann::json checkpoint_revision(const std::filesystem::path& model_dir, const std::string& recipe_revision) {
  nlohmann::json j = {{"path", model_dir.string()}, {"config_json_sha256", sha256_file(model_dir / "config.json")}};
  if (!recipe_revision.empty()) j["recipe_revision"] = recipe_revision;
  for (const char* name : {"revision", ".revision", "REVISION"}) {
    std::ifstream in(model_dir / name);
    if (!in) continue;
    std::stringstream ss;
    ss << in.rdbuf();
    j["revision_file"] = {{"name", name}, {"content", trim(ss.str())}};
    break;
  }
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(model_dir);
  if (canonical.parent_path().filename() == "snapshots") j["hf_snapshot"] = canonical.filename().string();
  return j;
}

nlohmann::json loaded_plugins() {
  nlohmann::json out = nlohmann::json::array();
  // The loader is loaded once per process, by the command (with its --plugin-dir): this only reads it.
  for (const auto& p : load_plugins({}).loaded())
    out.push_back({{"name", p.name},
                   {"version", p.version},
                   {"abi", std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor)},
                   {"file", p.path},
                   {"sha256", sha256_file(p.path)}});
  return out;
}

nlohmann::json capabilities() {
  nlohmann::json out = nlohmann::json::array();
  for (int k = 0; k < kNumPluginKinds; ++k)
    for (const auto* e : global_registry().list(static_cast<PluginKind>(k)))
      out.push_back({{"kind", plugin_kind_name(static_cast<PluginKind>(k))},
                     {"name", e->name},
                     {"provider", e->provider},
                     {"provider_version", e->provider_version}});
  return out;
}

nlohmann::json gpu_info() {
  // popen runs a shell: a missing nvidia-smi is exit status 127 and no output, not an error here.
  FILE* f = popen("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null", "r");
  nlohmann::json gpus = nlohmann::json::array();
  if (f) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      std::string s = trim(line);
      const size_t comma = s.rfind(',');
      if (comma == std::string::npos) continue;
      gpus.push_back({{"name", trim(s.substr(0, comma))}, {"driver", trim(s.substr(comma + 1))}});
    }
    pclose(f);
  }
  if (gpus.empty()) return "cpu";
  return gpus;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

}  // namespace kiln::cli
