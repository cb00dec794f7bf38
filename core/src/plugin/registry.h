// The registry of capabilities: (kind, name) → factory, filled by built-ins and by loaded plugins alike.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/plugin.h"

namespace kiln {

struct CapabilityEntry {
  PluginKind kind = PluginKind::kWeightFormat;
  std::string name;
  std::string description;
  SectionSchema schema;
  DeviceSet devices;               // the device types it implements
  void (*factory)() = nullptr;     // the registered Factory<Interface>, type-erased
  std::string provider;            // plugin name, or "builtin"
  std::string provider_version;
  std::string path;                // library file ("" for built-ins)
  std::shared_ptr<void> library;   // keeps the plugin's code loaded while objects it created live
};

class Registry {
 public:
  // Adds every entry or none: a plugin either registers completely or is refused.
  Status add_all(std::vector<CapabilityEntry> entries);

  const CapabilityEntry* find(PluginKind kind, const std::string& name) const;
  std::vector<const CapabilityEntry*> list(PluginKind kind) const;
  std::vector<std::string> names(PluginKind kind) const;

  // Creates an object of `Interface` named `name`. The returned pointer keeps the plugin library alive:
  // its deleter (plugin code) must run before the library can unload.
  // Refuses a device the entry does not implement (naming both).
  template <class Interface>
  Result<std::shared_ptr<Interface>> create(const std::string& name, const CreateContext& ctx) const {
    const CapabilityEntry* e = find(Interface::kKind, name);
    if (!e) return unknown(Interface::kKind, name);
    KILN_RETURN_IF_ERROR(check_device(*e, ctx.device.type));
    auto factory = reinterpret_cast<Factory<Interface>>(e->factory);
    Result<std::unique_ptr<Interface>> made = call_factory(factory, ctx, *e);
    if (!made.ok()) return made.status();
    std::shared_ptr<void> lib = e->library;
    return std::shared_ptr<Interface>(std::move(made).value().release(), [lib](Interface* p) { delete p; });
  }

  Status unknown(PluginKind kind, const std::string& name) const;
  // Why `e` cannot run on `device` ("kv_layout `fp32` is implemented on cpu, not on cuda"), or ok.
  static Status check_device(const CapabilityEntry& e, DeviceType device);

 private:
  template <class Interface>
  static Result<std::unique_ptr<Interface>> call_factory(Factory<Interface> f, const CreateContext& ctx,
                                                         const CapabilityEntry& e) {
    try {
      Result<std::unique_ptr<Interface>> r = f(ctx);
      if (r.ok() && !r.value()) return internal_error(describe(e) + " returned no object");
      return r;
    } catch (const std::exception& ex) {
      // A plugin must not throw; if one does, report it rather than terminate the process.
      return internal_error(describe(e) + " threw: " + ex.what());
    } catch (...) {
      return internal_error(describe(e) + " threw a non-standard exception");
    }
  }
  static std::string describe(const CapabilityEntry& e);

  std::map<std::pair<PluginKind, std::string>, CapabilityEntry> entries_;
};

// The process-wide registry the `kiln` command and the engine use (built-ins registered on first use).
Registry& global_registry();

}  // namespace kiln
