#include "plugin/registry.h"

#include <set>

namespace kiln {

Status Registry::add_all(std::vector<CapabilityEntry> entries) {
  std::set<std::pair<PluginKind, std::string>> seen;
  for (const auto& e : entries) {
    auto key = std::make_pair(e.kind, e.name);
    if (e.name.empty()) return invalid_argument(std::string(plugin_kind_name(e.kind)) + " registered with an empty name");
    if (!e.factory) return invalid_argument(describe(e) + " registered without a factory");
    if (e.devices.empty()) return invalid_argument(describe(e) + " registered for no device");
    if (!seen.insert(key).second) return already_exists(describe(e) + " is registered twice by the same plugin");
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      const CapabilityEntry& old = it->second;
      return already_exists(describe(e) + " is already provided by " + old.provider +
                            (old.path.empty() ? " (built in)" : " (" + old.path + ")"));
    }
  }
  for (auto& e : entries) {
    auto key = std::make_pair(e.kind, e.name);
    entries_.emplace(std::move(key), std::move(e));
  }
  return ok_status();
}

const CapabilityEntry* Registry::find(PluginKind kind, const std::string& name) const {
  auto it = entries_.find({kind, name});
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<const CapabilityEntry*> Registry::list(PluginKind kind) const {
  std::vector<const CapabilityEntry*> out;
  for (const auto& [key, e] : entries_)
    if (key.first == kind) out.push_back(&e);
  return out;
}

std::vector<std::string> Registry::names(PluginKind kind) const {
  std::vector<std::string> out;
  for (const auto* e : list(kind)) out.push_back(e->name);
  return out;
}

Status Registry::unknown(PluginKind kind, const std::string& name) const {
  std::string avail;
  for (const auto& n : names(kind)) avail += (avail.empty() ? "" : ", ") + n;
  return not_found(std::string("no plugin provides ") + plugin_kind_name(kind) + " `" + name + "` (available: " +
                   (avail.empty() ? "none" : avail) + "); `kiln plugins` lists what loaded and why files were refused");
}

Status Registry::check_device(const CapabilityEntry& e, DeviceType device) {
  if (e.devices.contains(device)) return ok_status();
  return unimplemented(describe(e) + " (" + (e.path.empty() ? "built in" : e.provider) + ") is implemented on " +
                       e.devices.to_string() + ", not on " + device_type_name(device));
}

std::string Registry::describe(const CapabilityEntry& e) {
  return std::string(plugin_kind_name(e.kind)) + " `" + e.name + "`";
}

}  // namespace kiln
