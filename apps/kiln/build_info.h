// What a result card or manifest records about the binary that produced it.
#pragma once

namespace kiln {

// The git commit kiln was built from: 12 hex digits, "-dirty" when tracked files differed from it, or "unknown"
// (built outside a git checkout). Written at build time by cmake/write_build_info.cmake.
const char* build_commit();

}  // namespace kiln
