#!/usr/bin/env bash
# The llama.cpp peer of `kiln bench decode` (issue 19, item 4), kept reproducible: llama.cpp's source comes from PyPI
# (llama-cpp-python's sdist vendors it under vendor/llama.cpp), is trimmed and packed here, carried to the GPU machine
# (which has no network) and built there; a random-weight GGUF of GLM-4.7-Flash's shapes cut to --layers layers is
# written there by tools/make_random_gguf.py, then llama-bench and kiln decode the same shapes and both are printed with
# their ratio. Nothing of llama.cpp is committed: the sdist, the tarball and the build live in ignored .llama/.
#
#   tools/llama_peer.sh --pack [SDIST.tar.gz]     # here, with network: pip download the sdist (or use the one given)
#                                                 # and write .llama/pack/llama.cpp-src.tar.xz (a few MB)
#   tools/llama_peer.sh [options]                 # on the GPU machine: build, write the GGUF, run both benches
#
# Options of a run (defaults in brackets):
#   --src PATH        the packed tarball or an unpacked llama.cpp source dir [.llama/pack/llama.cpp-src.tar.xz]
#   --work DIR        unpacked source, build tree, config and GGUF [.llama/work]
#   --results DIR     llama-bench.json, kiln-decode.json, commands.txt, summary.md [the --work dir]
#   --config FILE     the HF config.json whose shapes both run [configs/models/glm-4.7-flash/config.json]
#   --layers N        decoder layers of both models [12]
#   --depths LIST     contexts to decode at, comma-separated [4096,32768]
#   --gen N           tokens llama-bench decodes per repetition [128]
#   --reps N          llama-bench repetitions [3]
#   --kiln PATH       the kiln command [build/bin/kiln]; --no-kiln skips kiln's run
#   --recipe FILE     kiln's recipe; its model.path is overridden with the --layers config [configs/glm-4.7-flash-dummy.toml]
#   --cpu             build llama.cpp without CUDA and run llama-bench with -ngl 0 (a smoke test of the whole chain)
#   --jobs N          build jobs [nproc]
#   --prepare         build llama-bench and write the GGUF, run nothing (a first device call when one call of
#                     everything would not fit its time limit; the run after it reuses both)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gguf_pid=
die() { echo "llama_peer: $*" >&2; exit 2; }
log() { echo "== $*" >&2; }

# --- pack: the trimmed source ------------------------------------------------------------------------------------
# Only what configuring and building llama-bench needs (+ gguf-py, which make_random_gguf.py imports): the other
# ggml backends, docs, models, tests, examples and the web UI are left out (~176 MB → a few MB of xz).
pack() {
  local sdist=${1:-} out=$repo/.llama/pack/llama.cpp-src.tar.xz tmp
  mkdir -p "$repo/.llama/pack"
  if [ -z "$sdist" ]; then
    log "pip download llama-cpp-python (sdist)"
    python3 -m pip download llama-cpp-python --no-binary :all: --no-deps -d "$repo/.llama/sdist" >&2
    sdist=$(ls -t "$repo"/.llama/sdist/llama_cpp_python-*.tar.gz | head -1)
  fi
  [ -f "$sdist" ] || die "no sdist at $sdist"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  local version src
  version=$(basename "$sdist" .tar.gz)  # an sdist's top folder is named as the file
  tar -xzf "$sdist" -C "$tmp" "$version/vendor/llama.cpp" "$version/.git/modules/vendor/llama.cpp/HEAD"
  src=$tmp/$version/vendor/llama.cpp
  [ -f "$src/CMakeLists.txt" ] || die "$sdist vendors no llama.cpp"
  mkdir -p "$tmp/llama.cpp"
  (cd "$src" && cp -a CMakeLists.txt LICENSE cmake common ggml gguf-py include licenses src tools vendor "$tmp/llama.cpp/")
  # Keep ggml's core and the CPU and CUDA backends; the others are added only when enabled.
  for d in "$tmp"/llama.cpp/ggml/src/ggml-*/; do
    case $(basename "$d") in ggml-cpu|ggml-cuda) ;; *) rm -rf "$d" ;; esac
  done
  rm -rf "$tmp"/llama.cpp/tools/{ui,server,cli}  # only with LLAMA_BUILD_SERVER
  find "$tmp/llama.cpp" \( -name '*.md' -o -name '__pycache__' \) -prune -exec rm -rf {} +
  # The vendored commit (the sdist keeps the submodule's HEAD): the build stamps it into llama-bench's build_commit,
  # which would otherwise be read by git from whatever repository holds the unpacked source (this one).
  local commit
  commit=$(head -c 40 "$tmp/$version/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || echo unknown)
  echo "$version" >"$tmp/llama.cpp/PYPI_SOURCE"
  echo "$commit" >"$tmp/llama.cpp/LLAMA_COMMIT"
  tar -C "$tmp" -cf - llama.cpp | xz -9 -T0 >"$out"
  log "wrote $out ($(du -h "$out" | cut -f1)) from $version, llama.cpp ${commit:0:12}"
}

# --- build llama-bench ---------------------------------------------------------------------------------------------
unpack() {  # echoes the source dir
  local src=$1 work=$2 sum
  if [ -d "$src" ]; then echo "$src"; return; fi
  [ -f "$src" ] || die "no llama.cpp source at $src (make it with --pack)"
  # Unpacked again only when the tarball's content changes: a carried copy gets a new mtime on every call, and
  # fresh source mtimes would rebuild everything.
  sum=$(sha256sum "$src" | cut -d' ' -f1)
  if [ "$(cat "$work/llama.cpp/.tarball-sha256" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$work/llama.cpp"
    mkdir -p "$work"
    if command -v xz >/dev/null; then
      tar -xJf "$src" -C "$work"
    else  # Python's tarfile reads xz too
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$src" "$work"
    fi
    echo "$sum" >"$work/llama.cpp/.tarball-sha256"
  fi
  echo "$work/llama.cpp"
}

build() {
  local src=$1 bdir=$2 cpu=$3 jobs=$4 commit
  commit=$(head -c 12 "$src/LLAMA_COMMIT" 2>/dev/null || echo unknown)
  local backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a)
  [ "$cpu" = 1 ] && backend=(-DGGML_CUDA=OFF)
  # GGML_NATIVE=OFF keeps the CPU code portable; the CPU side does no work in a -ngl 99 decode.
  cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${backend[@]}" -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMIT="$commit" -DLLAMA_BUILD_NUMBER=0 >&2
  cmake --build "$bdir" --target llama-bench -j "$jobs" >&2
}

# --- the comparison ------------------------------------------------------------------------------------------------
run() {
  local src=$repo/.llama/pack/llama.cpp-src.tar.xz work=$repo/.llama/work config=$repo/configs/models/glm-4.7-flash/config.json
  local layers=12 depths=4096,32768 gen=128 reps=3 kiln=$repo/build/bin/kiln recipe=$repo/configs/glm-4.7-flash-dummy.toml
  local cpu=0 jobs prepare=0 no_kiln=0 results=
  jobs=$(nproc)
  while [ $# -gt 0 ]; do
    case $1 in
      --src) src=$(realpath "$2"); shift ;;
      --work) work=$2; shift ;;
      --results) results=$2; shift ;;
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
      --prepare) prepare=1 ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
    shift
  done
  mkdir -p "$work"
  work=$(realpath "$work")
  results=${results:-$work}
  local t0=$SECONDS srcdir bdir=$work/build-$([ "$cpu" = 1 ] && echo cpu || echo cuda)
  srcdir=$(unpack "$src" "$work")

  # The same shapes for both: the config with num_hidden_layers = --layers (and no next-n layer: neither bench
  # runs it), read by the GGUF writer and, through --set model.path, by kiln.
  local cfgdir=$work/model-${layers}layer gguf=$work/model-${layers}layer.gguf
  mkdir -p "$cfgdir"
  python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = int(sys.argv[2])
c["num_nextn_predict_layers"] = 0
types = c.get("mlp_layer_types")
if types is not None:  # transformers 5 saves the schedule per layer: keep the first N
    if len(types) < c["num_hidden_layers"]:
        sys.exit("--layers " + sys.argv[2] + ": the config schedules only %d layers" % len(types))
    c["mlp_layer_types"] = types[:c["num_hidden_layers"]]
json.dump(c, open(sys.argv[3], "w"), indent=2)' "$config" "$layers" "$cfgdir/config.json"
  # Written while llama-bench builds (it needs only gguf-py and numpy), on a quarter of the cores; kept while the
  # config is unchanged (the copy beside it is made only once the file is complete).
  if [ -f "$gguf" ] && cmp -s "$cfgdir/config.json" "$gguf.config.json"; then
    log "GGUF up to date: $gguf"
  else
    rm -f "$gguf" "$gguf.config.json"
    log "write the GGUF in the background: $gguf"
    (PYTHONPATH="$srcdir/gguf-py${PYTHONPATH:+:$PYTHONPATH}" python3 "$repo/tools/make_random_gguf.py" \
       --config "$cfgdir/config.json" --out "$gguf" --threads $(((jobs + 3) / 4)) >&2 &&
     cp "$cfgdir/config.json" "$gguf.config.json") &
    gguf_pid=$!
    trap 'kill $gguf_pid 2>/dev/null || true' EXIT  # a failed build leaves no writer behind
  fi

  log "build llama-bench ($([ "$cpu" = 1 ] && echo CPU || echo 'CUDA sm_90a'), -j$jobs) from $srcdir"
  build "$srcdir" "$bdir" "$cpu" "$jobs"
  local bench=$bdir/bin/llama-bench
  log "built after $((SECONDS - t0)) s: $bench"
  if [ -n "$gguf_pid" ]; then
    wait "$gguf_pid" || die "writing the GGUF failed"
    trap - EXIT
  fi
  log "GGUF ready after $((SECONDS - t0)) s: $gguf ($(du -h "$gguf" | cut -f1))"
  [ "$prepare" = 1 ] && return 0

  local ngl=99
  [ "$cpu" = 1 ] && ngl=0
  mkdir -p "$results"
  rm -f "$results/llama-bench.json" "$results/kiln-decode.json"
  local cmd=("$bench" -m "$gguf" -p 0 -n "$gen" -d "$depths" -fa 1 -ngl "$ngl" -r "$reps" -o json)
  log "${cmd[*]}"
  t0=$SECONDS
  "${cmd[@]}" >"$results/llama-bench.json"
  log "llama-bench took $((SECONDS - t0)) s"
  echo "llama-bench: ${cmd[*]}" >"$results/commands.txt"

  if [ "$no_kiln" = 0 ]; then
    local kcmd=("$kiln" bench decode "$recipe" --set "model.path=\"$cfgdir\"" --contexts "$depths" --batch 1
                --json "$results/kiln-decode.json")
    log "${kcmd[*]}"
    t0=$SECONDS
    "${kcmd[@]}" >&2 || log "kiln bench decode failed (exit $?): llama.cpp's figures alone"
    log "kiln took $((SECONDS - t0)) s"
    echo "kiln: ${kcmd[*]}" >>"$results/commands.txt"
  fi
  python3 - "$results" <<'EOF' | tee "$results/summary.md"
import json, os, sys
out = sys.argv[1]
llama = {r["n_depth"]: r for r in json.load(open(os.path.join(out, "llama-bench.json"))) if r["n_gen"] > 0}
kiln = {}
kpath = os.path.join(out, "kiln-decode.json")
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
  cat "$results/commands.txt" | tee -a "$results/summary.md"
}

if [ "${1:-}" = --pack ]; then
  shift
  pack "$@"
else
  run "$@"
fi
