#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang and runs each for a given time.
#
#   tools/fuzz.sh [--build-only] [SECONDS] [HARNESS...]      (default: 60 s each, every harness)
#
# The build (in $KILN_FUZZ_BUILD, default build-fuzz) compiles the whole tree with
# -fsanitize=address,undefined,fuzzer-no-link, so the harnesses see coverage of the core and any memory error or
# undefined behaviour is a crash. Each harness starts from the committed seeds in tests/fuzz/corpus/<name> and
# grows a working corpus in $KILN_FUZZ_BUILD/corpus/<name> (kept between runs); a crashing input is written to
# $KILN_FUZZ_BUILD/artifacts/<name>/. Prints one line per harness (executions, crashes) and exits 1 when any
# harness crashed. The harnesses: request, chat_template, output_parsers, tokenizer, tokenizer_json, recipe,
# safetensors, model_config, image_decode (ls tests/fuzz/*_fuzz.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_FUZZ_BUILD:-build-fuzz}
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
seconds=${1:-60}
shift || true
harnesses=("$@")
if [ ${#harnesses[@]} = 0 ]; then
  for f in tests/fuzz/*_fuzz.cpp; do harnesses+=("$(basename "$f" _fuzz.cpp)"); done
fi

# Sanitizers report through llvm-symbolizer; leaks are checked too (the harnesses free what they allocate).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer"
if [ ! -f "$build/build.ninja" ]; then
  mkdir -p "$build"
  # -O1 with line tables only, as OSS-Fuzz builds: quicker to compile than -O2 -g, and enough for the reports.
  # KILN_FUZZ_OPT=-O0 compiles in two thirds of the time but runs 4 to 40 times fewer executions a second.
  opt=${KILN_FUZZ_OPT:--O1}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt -gline-tables-only -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -gline-tables-only -DNDEBUG" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" -DKILN_WITH_CUDA=OFF -DKILN_FUZZ=ON \
    > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" --target kiln_fuzzers -j"$(nproc)"
[ $build_only = 1 ] && exit 0

failed=0
for name in "${harnesses[@]}"; do
  exe="$build/bin/kiln_fuzz_$name"
  [ -x "$exe" ] || { echo "no harness '$name' ($exe)"; exit 2; }
  corpus="$build/corpus/$name" artifacts="$build/artifacts/$name"
  mkdir -p "$corpus" "$artifacts"
  log="$build/fuzz-$name.log"
  stamp="$build/fuzz-$name.started"
  touch "$stamp"  # this run's crashes are the artifacts newer than it
  set +e
  "$exe" "$corpus" "tests/fuzz/corpus/$name" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=4096 -artifact_prefix="$artifacts/" > "$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  crashes=$(find "$artifacts" -type f -newer "$stamp" | wc -l)
  echo "fuzz $name: ${seconds}s, ${runs:-0} executions, $crashes crashes (exit $rc, log $log)"
  if [ $rc != 0 ] || [ "$crashes" != 0 ]; then
    failed=1
    grep -m1 -A20 -E "ERROR: |runtime error|invariant violated|deadly signal" "$log" || tail -20 "$log"
  fi
done
exit $failed
