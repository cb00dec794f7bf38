// Collects what one plugin (or the built-ins) registers, so the registry can take all of it or none.
#pragma once

#include <string>
#include <vector>

#include "plugin/registry.h"

namespace kiln {

class StagingRegistrar final : public Registrar {
 public:
  StagingRegistrar(std::string provider, std::string version, std::string path, std::shared_ptr<void> library)
      : provider_(std::move(provider)), version_(std::move(version)), path_(std::move(path)), library_(std::move(library)) {}

  std::vector<CapabilityEntry>& entries() { return entries_; }

 protected:
  Status add_erased(PluginKind kind, const char* name, const char* description, ErasedFactory factory,
                    DeviceSet devices, SectionSchema schema) override {
    if (static_cast<uint32_t>(kind) >= kNumPluginKinds)
      return invalid_argument("unknown capability kind " + std::to_string(static_cast<uint32_t>(kind)));
    CapabilityEntry e;
    e.kind = kind;
    e.name = name ? name : "";
    e.description = description ? description : "";
    e.schema = std::move(schema);
    e.devices = devices;
    e.factory = factory;
    e.provider = provider_;
    e.provider_version = version_;
    e.path = path_;
    e.library = library_;
    entries_.push_back(std::move(e));
    return ok_status();
  }

 private:
  std::string provider_, version_, path_;
  std::shared_ptr<void> library_;
  std::vector<CapabilityEntry> entries_;
};

}  // namespace kiln
