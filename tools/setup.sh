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
# NCCL, for plugins/transport-nccl: NVIDIA's CUDA toolkit installs on these machines carry it; elsewhere it is the CUDA
# apt repository's libnccl-dev (Debian has none). Without it CMake skips the plugin with a message.
if command -v nvcc > /dev/null; then
  cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
  if [ ! -e "$cuda_root/include/nccl.h" ] && [ ! -e /usr/include/nccl.h ] && [ ! -e /usr/local/include/nccl.h ]; then
    if apt-cache policy libnccl-dev 2> /dev/null | grep -q 'Candidate: [0-9]'; then
      $sudo apt-get install -y -qq --no-install-recommends libnccl-dev > /dev/null
    else
      echo "setup: no NCCL (nccl.h) and no libnccl-dev in apt (add NVIDIA's CUDA repository); transport-nccl is skipped"
    fi
  fi
fi
echo "setup: packages ready ($(date -u +%H:%M:%S)); configuring and building ./build"
# -O2 without debug info: the code of a RelWithDebInfo build, in three quarters of its compile time (-g costs a third on
# top of -O2 here). KILN_BUILD_TYPE=RelWithDebInfo gives the debug info back.
build_type=${KILN_BUILD_TYPE:-Release}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CUDA_FLAGS_RELEASE="-O2 -DNDEBUG" > build.configure.log 2>&1 || { cat build.configure.log; exit 1; }
cmake --build build -j"$(nproc)"
