# xgrammar (https://github.com/mlc-ai/xgrammar), the grammar engine behind constrained decoding
# (docs/structured_output.md says why this one). Its source is not in git: the pinned PyPI sdist is fetched once,
# checked against its SHA-256, cached under .deps/ (gitignored) and built here as a static C++ library with the
# project's compiler and flags (so the ASan + UBSan build instruments it too). Offline: pass
# -DKILN_XGRAMMAR_TARBALL=/path/to/xgrammar-<version>.tar.gz (the hash is still checked).
set(KILN_XGRAMMAR_VERSION 0.2.9)
set(KILN_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
# PyPI's file URL for that sdist (from https://pypi.org/simple/xgrammar/).
set(KILN_XGRAMMAR_URL
    "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${KILN_XGRAMMAR_VERSION}.tar.gz")
set(KILN_DEPS_DIR "${PROJECT_SOURCE_DIR}/.deps" CACHE PATH "Where fetched third-party sources are cached")
set(KILN_XGRAMMAR_TARBALL "${KILN_DEPS_DIR}/xgrammar-${KILN_XGRAMMAR_VERSION}.tar.gz"
    CACHE FILEPATH "The xgrammar sdist (fetched from PyPI when absent)")

set(kiln_xgrammar_src "${KILN_DEPS_DIR}/xgrammar-${KILN_XGRAMMAR_VERSION}")
if(NOT EXISTS "${kiln_xgrammar_src}/CMakeLists.txt")
  if(EXISTS "${KILN_XGRAMMAR_TARBALL}")
    file(SHA256 "${KILN_XGRAMMAR_TARBALL}" kiln_xgrammar_have)
    if(NOT kiln_xgrammar_have STREQUAL KILN_XGRAMMAR_SHA256)
      message(FATAL_ERROR "${KILN_XGRAMMAR_TARBALL} has SHA-256 ${kiln_xgrammar_have}, expected "
                          "${KILN_XGRAMMAR_SHA256} (xgrammar ${KILN_XGRAMMAR_VERSION}); delete it to fetch it again")
    endif()
  else()
    message(STATUS "Fetching xgrammar ${KILN_XGRAMMAR_VERSION} from PyPI into ${KILN_DEPS_DIR}")
    file(DOWNLOAD "${KILN_XGRAMMAR_URL}" "${KILN_XGRAMMAR_TARBALL}.part" EXPECTED_HASH SHA256=${KILN_XGRAMMAR_SHA256}
         TLS_VERIFY ON STATUS kiln_xgrammar_status)
    list(GET kiln_xgrammar_status 0 kiln_xgrammar_code)
    if(NOT kiln_xgrammar_code EQUAL 0)
      file(REMOVE "${KILN_XGRAMMAR_TARBALL}.part")
      message(FATAL_ERROR "could not fetch ${KILN_XGRAMMAR_URL}: ${kiln_xgrammar_status} "
                          "(offline: -DKILN_XGRAMMAR_TARBALL=<the sdist>)")
    endif()
    file(RENAME "${KILN_XGRAMMAR_TARBALL}.part" "${KILN_XGRAMMAR_TARBALL}")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${KILN_XGRAMMAR_TARBALL}" DESTINATION "${KILN_DEPS_DIR}")
endif()

# Only the C++ library: no Python bindings, tests or tracing. xgrammar reads its options from a config.cmake in its
# source tree (its shipped cmake/config.cmake turns the Python bindings on), so one is written there. Its own flags add
# -Werror (other compilers warn differently) and -flto=auto (GCC's LTO objects in a static library break a clang or
# non-LTO link); flags set here come after its own, so they win. Its install rules (skipped under SKBUILD) would
# install headers from kiln's root: kiln links it statically into libkiln_core and installs none of it.
file(WRITE "${kiln_xgrammar_src}/config.cmake"
     "# Written by kiln's cmake/Xgrammar.cmake.\n"
     "set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\n"
     "set(XGRAMMAR_ENABLE_CPPTRACE OFF)\nset(XGRAMMAR_ENABLE_COVERAGE OFF)\nset(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)\n")
set(SKBUILD ON)
set(kiln_saved_cxx_flags "${CMAKE_CXX_FLAGS}")
string(APPEND CMAKE_CXX_FLAGS " -fno-lto -Wno-error -w")
add_subdirectory("${kiln_xgrammar_src}" "${CMAKE_BINARY_DIR}/_deps/xgrammar" EXCLUDE_FROM_ALL SYSTEM)
set(CMAKE_CXX_FLAGS "${kiln_saved_cxx_flags}")
unset(SKBUILD)
