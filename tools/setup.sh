#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for kiln: installs the build dependencies (Debian packages listed in
# .ci/apt-packages.txt), configures and builds into ./build. CUDA code is built when nvcc is found.
# Configuring fetches the one source dependency that Debian does not package, xgrammar (constrained decoding), as its
# pinned PyPI sdist with a checked SHA-256, into .deps/ (gitignored; cmake/Xgrammar.cmake), once per checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
wanted=$(grep -v '^\s*#' .ci/apt-packages.txt | xargs)
# Only touch apt when something is missing: a set-up machine re-runs this in seconds.
if ! dpkg-query -W -f='${Status}\n' $wanted 2>/dev/null | grep -c 'install ok installed' | grep -qx "$(echo $wanted | wc -w)"; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends $wanted > /dev/null
fi
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc > /dev/null; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
cmake --build build -j"$(nproc)"
