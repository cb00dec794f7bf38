// Logging for plugins and core alike: spdlog's default logger, configured by the `kiln` command
// (--log-level, KILN_LOG_LEVEL). Plugins log through these so their lines share the host's format.
#pragma once

#include <spdlog/spdlog.h>

namespace kiln::log {
using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::trace;
using spdlog::warn;
}  // namespace kiln::log
