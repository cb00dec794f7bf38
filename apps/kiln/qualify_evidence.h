// What the evidence manifest of `kiln qualify` records about the things a result depends on: file digests, the
// checkpoint's revision, the plugins loaded, the machine.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace kiln::cli {

// SHA-256 of a file as 64 hex digits, "" when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);
std::string sha256_text(const std::string& text);

// The checkpoint in `model_dir`: its config.json's SHA-256, the recipe's `model.revision`, a revision file
// (`revision`, `.revision`, `REVISION`) when the directory has one, and the Hugging Face snapshot commit when the
// directory is a hub cache snapshot (…/snapshots/<commit>).
nlohmann::json checkpoint_revision(const std::filesystem::path& model_dir, const std::string& recipe_revision);

// Name, version, file and its SHA-256 of each plugin this process loaded (what `kiln plugins` lists).
nlohmann::json loaded_plugins();

// Every capability registered (built-in or from a plugin): kind, name, provider and its version.
nlohmann::json capabilities();

// {"name", "driver"} of each GPU nvidia-smi lists, or "cpu" when there is no nvidia-smi or no GPU.
nlohmann::json gpu_info();

// Now, as 2026-12-02T12:00:00Z.
std::string utc_now();

}  // namespace kiln::cli
