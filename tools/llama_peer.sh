#!/usr/bin/env bash
# The llama.cpp peer of `kiln bench decode` (issue 19, item 4), kept reproducible: llama.cpp's source comes from PyPI
# (llama-cpp-python's sdist vendors it under vendor/llama.cpp), is trimmed and packed here, carried to the GPU machine
# (which has no network) and built there; a random-weight GGUF of GLM-4.7-Flash's shapes cut to --layers layers is
# written there by tools/make_random_gguf.py, then llama-bench and kiln decode the same shapes and both are printed with
# their ratio. Nothing of llama.cpp is committed: the sdist, the tarball and the build live in ignored .llama/.
#
#   tools/llama_peer.sh --pack [SDIST.tar.gz]     # here, with network: pip download the sdist (or use the one given)
#                                                 # and write .llama/llama.cpp-src.tar.xz (a few MB)
#   tools/llama_peer.sh [options]                 # on the GPU machine: build, write the GGUF, run both benches
#
# Options of a run (defaults in brackets):
#   --src PATH        the packed tarball or an unpacked llama.cpp source dir [.llama/llama.cpp-src.tar.xz]
#   --work DIR        build tree, GGUF, config and results [.llama/work]
#   --config FILE     the HF config.json whose shapes both run [configs/models/glm-4.7-flash/config.json]
#   --layers N        decoder layers of both models [12]
#   --depths LIST     contexts to decode at, comma-separated [4096,32768]
#   --gen N           tokens llama-bench decodes per repetition [128]
#   --reps N          llama-bench repetitions [3]
#   --kiln PATH       the kiln command [build/bin/kiln]; --no-kiln skips kiln's run
#   --recipe FILE     kiln's recipe; its model.path is overridden with the --layers config [configs/glm-4.7-flash-dummy.toml]
#   --cpu             build llama.cpp without CUDA and run llama-bench with -ngl 0 (a smoke test of the whole chain)
#   --jobs N          build jobs [nproc]
#   --only-build      stop after building llama-bench
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "llama_peer: $*" >&2; exit 2; }
log() { echo "== $*" >&2; }

# --- pack: the trimmed source ------------------------------------------------------------------------------------
# Only what configuring and building llama-bench needs (+ gguf-py, which make_random_gguf.py imports): the other
# ggml backends, docs, models, tests, examples and the web UI are left out (~176 MB → a few MB of xz).
pack() {
  local sdist=${1:-} out=$repo/.llama/llama.cpp-src.tar.xz tmp
  mkdir -p "$repo/.llama"
  if [ -z "$sdist" ]; then
    log "pip download llama-cpp-python (sdist)"
    python3 -m pip download llama-cpp-python --no-binary :all: --no-deps -d "$repo/.llama/sdist" >&2
    sdist=$(ls -t "$repo"/.llama/sdist/llama_cpp_python-*.tar.gz | head -1)
  fi
  [ -f "$sdist" ] || die "no sdist at $sdist"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  tar -xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/*'
  local src
  src=$(echo "$tmp"/*/vendor/llama.cpp)
  [ -f "$src/CMakeLists.txt" ] || die "$sdist vendors no llama.cpp"
  local version
  version=$(basename "$sdist" .tar.gz)
  mkdir -p "$tmp/llama.cpp"
  (cd "$src" && cp -a CMakeLists.txt LICENSE cmake common ggml gguf-py include licenses src tools vendor "$tmp/llama.cpp/")
  # Keep ggml's core and the CPU and CUDA backends; the others are added only when enabled.
  for d in "$tmp"/llama.cpp/ggml/src/ggml-*/; do
    case $(basename "$d") in ggml-cpu|ggml-cuda) ;; *) rm -rf "$d" ;; esac
  done
  rm -rf "$tmp"/llama.cpp/tools/{ui,server,cli}  # only with LLAMA_BUILD_SERVER
  find "$tmp/llama.cpp" \( -name '*.md' -o -name '__pycache__' \) -prune -exec rm -rf {} +
  echo "$version" >"$tmp/llama.cpp/PYPI_SOURCE"
  tar -C "$tmp" -cf - llama.cpp | xz -9 -T0 >"$out"
  log "wrote $out ($(du -h "$out" | cut -f1)) from $version"
}

# --- build llama-bench ---------------------------------------------------------------------------------------------
unpack() {  # echoes the source dir
  local src=$1 work=$2
  if [ -d "$src" ]; then echo "$src"; return; fi
  [ -f "$src" ] || die "no llama.cpp source at $src (make it with --pack)"
  if [ ! -f "$work/llama.cpp/CMakeLists.txt" ] || [ "$src" -nt "$work/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$work/llama.cpp"
    mkdir -p "$work"
    tar -xJf "$src" -C "$work"
    touch "$work/llama.cpp/CMakeLists.txt"
  fi
  echo "$work/llama.cpp"
}

build() {
  local src=$1 bdir=$2 cpu=$3 jobs=$4
  local backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a)
  [ "$cpu" = 1 ] && backend=(-DGGML_CUDA=OFF)
  # GGML_NATIVE=OFF keeps the CPU code portable; the CPU side does no work in a -ngl 99 decode.
  cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${backend[@]}" -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
  cmake --build "$bdir" --target llama-bench -j "$jobs" >&2
}

# --- the comparison ------------------------------------------------------------------------------------------------
run() {
  local src=$repo/.llama/llama.cpp-src.tar.xz work=$repo/.llama/work config=$repo/configs/models/glm-4.7-flash/config.json
  local layers=12 depths=4096,32768 gen=128 reps=3 kiln=$repo/build/bin/kiln recipe=$repo/configs/glm-4.7-flash-dummy.toml
  local cpu=0 jobs only_build=0 no_kiln=0
  jobs=$(nproc)
  while [ $# -gt 0 ]; do
    case $1 in
      --src) src=$(realpath "$2"); shift ;;
      --work) work=$2; shift ;;
      --config) config=$(realpath "$2"); shift ;;
      --layers) layers=$2; shift ;;
      --depths) depths=$2; shift ;;
      --gen) gen=$2; shift ;;
      --reps) reps=$2; shift ;;
      --kiln) kiln=$(realpath "$2"); shift ;;
      --recipe) recipe=$(realpath "$2"); shift ;;
      --no-kiln) no_kiln=1 ;;
      --cpu) cpu=1 ;;
      --jobs) jobs=$2; shift ;;
      --only-build) only_build=1 ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
    shift
  done
  mkdir -p "$work"
  work=$(realpath "$work")
  local t0=$SECONDS srcdir bdir=$work/build-$([ "$cpu" = 1 ] && echo cpu || echo cuda)
  srcdir=$(unpack "$src" "$work")
  log "build llama-bench ($([ "$cpu" = 1 ] && echo CPU || echo 'CUDA sm_90a'), -j$jobs) from $srcdir"
  build "$srcdir" "$bdir" "$cpu" "$jobs"
  local bench=$bdir/bin/llama-bench
  log "built in $((SECONDS - t0)) s: $bench"
  [ "$only_build" = 1 ] && return 0

  # The same shapes for both: the config with num_hidden_layers = --layers (and no next-n layer: neither bench
  # runs it), written once and read by the GGUF writer and, through --set model.path, by kiln.
  local cfgdir=$work/model-${layers}layer gguf=$work/model-${layers}layer.gguf
  mkdir -p "$cfgdir"
  python3 - "$config" "$layers" "$cfgdir/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = int(sys.argv[2])
c["num_nextn_predict_layers"] = 0
c.pop("mlp_layer_types", None)  # first_k_dense_replace says the same for any layer count
json.dump(c, open(sys.argv[3], "w"), indent=2)
EOF
  t0=$SECONDS
  PYTHONPATH="$srcdir/gguf-py${PYTHONPATH:+:$PYTHONPATH}" python3 "$repo/tools/make_random_gguf.py" \
    --config "$cfgdir/config.json" --out "$gguf" >&2
  log "GGUF written in $((SECONDS - t0)) s: $gguf ($(du -h "$gguf" | cut -f1))"

  local ngl=99
  [ "$cpu" = 1 ] && ngl=0
  local cmd=("$bench" -m "$gguf" -p 0 -n "$gen" -d "$depths" -fa 1 -ngl "$ngl" -r "$reps" -o json)
  log "${cmd[*]}"
  "${cmd[@]}" >"$work/llama-bench.json"
  echo "llama-bench: ${cmd[*]}" >"$work/commands.txt"

  if [ "$no_kiln" = 0 ]; then
    local kcmd=("$kiln" bench decode "$recipe" --set "model.path=\"$cfgdir\"" --contexts "$depths" --batch 1
                --json "$work/kiln-decode.json")
    log "${kcmd[*]}"
    "${kcmd[@]}" >&2
    echo "kiln: ${kcmd[*]}" >>"$work/commands.txt"
  fi
  python3 - "$work" <<'EOF'
import json, os, sys
work = sys.argv[1]
llama = {r["n_depth"]: r for r in json.load(open(os.path.join(work, "llama-bench.json"))) if r["n_gen"] > 0}
kiln = {}
kpath = os.path.join(work, "kiln-decode.json")
if os.path.exists(kpath):
    for p in json.load(open(kpath)).get("points", []):
        if p.get("batch", 1) == 1 and "tok_s" in p:
            kiln[p["context"]] = p["tok_s"]
first = next(iter(llama.values()))
print(f"llama.cpp {first.get('build_commit', '?')} (build {first.get('build_number', '?')}), {first.get('gpu_info') or first.get('cpu_info')}, "
      f"{first.get('model_type')}, {first.get('model_size', 0) / 2**30:.2f} GiB, fa={first.get('flash_attn')}, ngl={first.get('n_gpu_layers')}")
print("\n| depth | llama.cpp tok/s (± sd) | kiln tok/s | kiln / llama.cpp |\n|---|---|---|---|")
for d, r in sorted(llama.items()):
    k = kiln.get(d)
    print(f"| {d} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} | {k:.1f} | {k / r['avg_ts']:.2f}× |" if k else
          f"| {d} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} | – | – |")
EOF
  cat "$work/commands.txt"
}

if [ "${1:-}" = --pack ]; then
  shift
  pack "$@"
else
  run "$@"
fi
