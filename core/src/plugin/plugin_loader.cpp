#include "plugin/plugin_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <system_error>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "kiln/log.h"
#include "plugin/staging_registrar.h"

namespace kiln {
namespace fs = std::filesystem;

namespace {

// Fields every descriptor has had since ABI 1.0 (2.0 kept them); a smaller struct_size is not a kiln plugin.
constexpr size_t kMinDescriptorSize = offsetof(KilnPluginDescriptor, register_fn) + sizeof(void*);

std::string field(const char* s) { return s ? s : ""; }

// The first ABI minor in which each kind's interface took its current shape. A plugin built against an
// older minor still loads, but not its capabilities of a kind whose structs have grown since.
// Every kind took its current shape in 2.0 (device-aware interfaces).
constexpr uint32_t kMinMinorForKind[kNumPluginKinds] = {
    0,  // weight_format
    7,  // kv_layout: MlaAttendArgs::out_lse appended in ABI 2.7 (an older layout would leave it unwritten); 2.4
        // appended KvLayout::indexer_key_format (an older vtable lacks the slot the host calls)
    0,  // drafter
    6,  // collective: ABI 2.6 appended Collective::all_reduce_moe_combine_norm, which the host calls
    4,  // modality: ABI 2.4 appended Modality::encode_all, which the host calls (an older vtable has no slot)
    1,  // quantizer: the kind exists from ABI 2.1 (appended to the enum; no struct of an older kind changed)
};

}  // namespace

bool is_plugin_file_name(const fs::path& p) {
  std::string name = p.filename().string();
  std::string ext = p.extension().string();
  return name.rfind("kiln-", 0) == 0 && (ext == ".so" || ext == ".dylib" || ext == ".dll");
}

std::vector<fs::path> plugin_search_path(const std::vector<std::string>& cli_dirs) {
  std::vector<fs::path> dirs;
  for (const auto& d : cli_dirs) dirs.emplace_back(d);
  if (const char* env = std::getenv("KILN_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) dirs.emplace_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  dirs.emplace_back(fs::path(KILN_INSTALL_PREFIX) / KILN_INSTALL_LIBDIR / "kiln" / "plugins");
  std::error_code ec;
  fs::path exe_dir = boost::dll::program_location(ec).parent_path();
  if (!ec && !exe_dir.empty()) {
    dirs.push_back(exe_dir.parent_path() / "lib" / "kiln" / "plugins");
    dirs.push_back(exe_dir);
  }
  // The same directory reached twice (build tree == install prefix) is searched once.
  std::vector<fs::path> unique;
  std::set<std::string> seen;
  for (auto& d : dirs) {
    fs::path canon = fs::weakly_canonical(d, ec);
    std::string key = ec ? d.string() : canon.string();
    if (seen.insert(key).second) unique.push_back(d);
  }
  return unique;
}

Status check_plugin_dirs(const std::vector<std::string>& cli_dirs) {
  for (const auto& d : cli_dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) return not_found("--plugin-dir " + d + ": no such directory");
  }
  return ok_status();
}

void PluginLoader::load_search_path(const std::vector<fs::path>& dirs) {
  for (const auto& d : dirs) load_directory(d);
}

void PluginLoader::load_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  searched_.push_back(dir);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_plugin_file_name(entry.path())) files.push_back(entry.path());
  std::sort(files.begin(), files.end());  // deterministic: the same directory always loads in the same order
  for (const auto& f : files) (void)load_file(f);
}

Status PluginLoader::load_file(const fs::path& file) {
  Status s = try_load(file);
  if (!s.ok()) {
    refused_.push_back({file.string(), s.message()});
    log::warn("plugin {} refused: {}", file.string(), s.message());
  }
  return s;
}

Status PluginLoader::try_load(const fs::path& file) {
  for (const auto& p : loaded_) {
    std::error_code ec;
    if (fs::equivalent(p.path, file, ec)) return already_exists("this file is already loaded");
  }
  auto lib = std::make_shared<boost::dll::shared_library>();
  // rtld_local keeps each plugin's symbols private; rtld_now surfaces missing symbols at load, not mid-run.
  boost::dll::fs::error_code ec;
  lib->load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec) {
    // Boost.DLL reports every dlopen failure as "Bad file descriptor"; the dynamic loader's reason is still
    // waiting in dlerror().
    const char* reason = dlerror();
    return failed_precondition(std::string("cannot be loaded as a shared library: ") +
                               (reason ? reason : ec.message()));
  }
  if (!lib->has(KILN_PLUGIN_ENTRY_ALIAS))
    return not_found("no `" KILN_PLUGIN_ENTRY_ALIAS "` entry point: not a kiln plugin (was it built with KILN_PLUGIN(...))?");

  const KilnPluginDescriptor* d = nullptr;
  try {
    auto entry = lib->get_alias<const KilnPluginDescriptor*()>(KILN_PLUGIN_ENTRY_ALIAS);
    d = entry();
  } catch (const std::exception& e) {
    return failed_precondition(std::string("entry point failed: ") + e.what());
  }
  if (!d) return failed_precondition("entry point returned no descriptor");
  if (d->abi_major != KILN_ABI_MAJOR)
    return failed_precondition("built for kiln plugin ABI " + std::to_string(d->abi_major) + "." +
                               std::to_string(d->abi_minor) + ", but this kiln provides ABI " +
                               std::to_string(KILN_ABI_MAJOR) + "." + std::to_string(KILN_ABI_MINOR) +
                               "; rebuild the plugin against this kiln's SDK");
  if (d->abi_minor > KILN_ABI_MINOR)
    return failed_precondition("built for kiln plugin ABI " + std::to_string(d->abi_major) + "." +
                               std::to_string(d->abi_minor) + ", newer than this kiln's " +
                               std::to_string(KILN_ABI_MAJOR) + "." + std::to_string(KILN_ABI_MINOR) +
                               "; upgrade kiln or rebuild the plugin");
  if (d->struct_size < kMinDescriptorSize)
    return failed_precondition("descriptor is " + std::to_string(d->struct_size) + " bytes, smaller than ABI " +
                               std::to_string(KILN_ABI_MAJOR) + " requires (" + std::to_string(kMinDescriptorSize) + ")");
  if (field(d->abi_tag) != KILN_ABI_TAG)
    return failed_precondition("built with C++ ABI `" + field(d->abi_tag) + "`, this kiln uses `" KILN_ABI_TAG
                               "`; build it with the same compiler family and standard library");
  if (field(d->name).empty()) return invalid_argument("descriptor has no name");
  if (!d->register_fn) return invalid_argument("descriptor has no register_fn");
  for (const auto& p : loaded_)
    if (p.name == field(d->name))
      return already_exists("a plugin named `" + p.name + "` is already loaded from " + p.path);

  StagingRegistrar staging(field(d->name), field(d->version), file.string(), lib);
  try {
    KILN_RETURN_IF_ERROR(d->register_fn(staging).with_context("register_fn"));
  } catch (const std::exception& e) {
    return internal_error(std::string("register_fn threw: ") + e.what());
  } catch (...) {
    return internal_error("register_fn threw a non-standard exception");
  }
  if (staging.entries().empty()) return invalid_argument("registered no capabilities");
  for (const auto& e : staging.entries()) {
    const uint32_t needed = kMinMinorForKind[static_cast<uint32_t>(e.kind)];
    if (d->abi_minor < needed)
      return failed_precondition(std::string(plugin_kind_name(e.kind)) + " `" + e.name + "` was built for ABI " +
                                 std::to_string(d->abi_major) + "." + std::to_string(d->abi_minor) + "; the " +
                                 plugin_kind_name(e.kind) + " interface changed in ABI " +
                                 std::to_string(KILN_ABI_MAJOR) + "." + std::to_string(needed) +
                                 ": rebuild the plugin against this kiln's SDK");
  }

  LoadedPlugin info;
  info.path = file.string();
  info.name = field(d->name);
  info.version = field(d->version);
  info.description = field(d->description);
  info.abi_major = d->abi_major;
  info.abi_minor = d->abi_minor;
  for (const auto& e : staging.entries()) info.provides.emplace_back(e.kind, e.name);
  KILN_RETURN_IF_ERROR(registry_.add_all(std::move(staging.entries())));
  log::debug("loaded plugin {} {} from {}", info.name, info.version, info.path);
  loaded_.push_back(std::move(info));
  return ok_status();
}

}  // namespace kiln
