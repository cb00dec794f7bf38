#!/usr/bin/env bash
# Packs what a GPU run needs from a build tree into a folder to carry to the device machine (the device tool sends
# the checkout plus named ignored paths, 64 MiB in all): the kiln command, the test and benchmark programs, libkiln_core
# and the plugins, debug info stripped, in the build tree's bin/ lib/ layout (their RUNPATH is $ORIGIN/../lib), plus the
# Debian libraries they link that Ubuntu 24.04 lacks (Boost, spdlog, fmt, toml++, ...: run there with
# LD_LIBRARY_PATH=OUT_DIR/lib). glibc, libstdc++, libgcc and CUDA's libraries are the device machine's own.
#   tools/device_carry.sh BUILD_DIR OUT_DIR [program...]    (default programs: kiln kiln_gpu_tests)
set -euo pipefail
build=$1 out=$2
shift 2
programs=("$@")
[ ${#programs[@]} -gt 0 ] || programs=(kiln kiln_gpu_tests)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/kiln/plugins"
for p in "${programs[@]}"; do strip --strip-debug -o "$out/bin/$p" "$build/bin/$p"; done
for f in "$build"/lib/libkiln_core.so*; do
  if [ -L "$f" ]; then cp -P "$f" "$out/lib/"; else strip --strip-debug -o "$out/lib/$(basename "$f")" "$f"; fi
done
for f in "$build"/lib/kiln/plugins/*.so; do strip --strip-debug -o "$out/lib/kiln/plugins/$(basename "$f")" "$f"; done
# The plugin template built in-tree for the GPU tests (they find it under the build tree's tests/plugin-template).
if compgen -G "$build/tests/plugin-template/*.so" > /dev/null; then
  mkdir -p "$out/tests/plugin-template"
  for f in "$build"/tests/plugin-template/*.so; do strip --strip-debug -o "$out/tests/plugin-template/$(basename "$f")" "$f"; done
fi
ldd "$out"/bin/* "$out"/lib/libkiln_core.so* "$out"/lib/kiln/plugins/*.so 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcu[A-Za-z]*|libnccl|libkiln_core)[.-]' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
