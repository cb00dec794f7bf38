#!/usr/bin/env bash
# Installs the kiln build into a scratch prefix, builds the plugin template out of tree against it with
# find_package(kiln) (its CUDA half too where nvcc exists), and lists plugins with their devices with the
# installed `kiln`.
set -euo pipefail
build_dir=$1 template_dir=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
step() {  # runs a step quietly; on failure shows its log
  local log=$1; shift
  "$@" > "$log" 2>&1 || { echo "FAILED: $*"; cat "$log"; exit 1; }
}
step "$work/install.log" cmake --install "$build_dir" --prefix "$work/prefix"
step "$work/configure.log" cmake -S "$template_dir" -B "$work/build" -G Ninja -Dkiln_DIR="$work/prefix/lib/cmake/kiln"
step "$work/build.log" cmake --build "$work/build"
"$work/prefix/bin/kiln" plugins -v --plugin-dir "$work/build"
