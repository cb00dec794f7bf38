#!/usr/bin/env bash
# Runs the GPU tests (build/bin/kiln_gpu_tests) under NVIDIA compute-sanitizer, one test per process so that a
# report names its test and one slow test cannot hide the others. Run it on the GPU machine after a build with
# CUDA (bash tools/setup.sh), whenever a kernel or the device runtime changes:
#
#   tools/gpu_sanitizers.sh                       memcheck, then racecheck, over every GPU test
#   tools/gpu_sanitizers.sh racecheck 'Moe*'      one tool, the tests matching a gtest filter
#   TOOLS="memcheck racecheck synccheck" tools/gpu_sanitizers.sh
#
#   memcheck   out-of-bounds / misaligned device accesses, device-side leaks (--leak-check full)
#   racecheck  shared-memory hazards between threads of a block
#   synccheck  invalid barrier use (divergent __syncthreads, named barriers with mismatched counts)
#   initcheck  reads of uninitialised global memory
#
# Each test's full report goes to $OUT/<tool>/<test>.log (OUT defaults to build/gpu-sanitizers); the summary
# lists every test that was not clean. Exits 1 when any test had a report or failed, 77 when there is no GPU.
# Expect racecheck to take minutes per test: it serialises and instruments every shared-memory access.
set -uo pipefail
cd "$(dirname "$0")/.."
exe=${KILN_GPU_TESTS:-build/bin/kiln_gpu_tests}
out=${OUT:-build/gpu-sanitizers}
timeout_s=${TEST_TIMEOUT:-1800}
tools=${TOOLS:-memcheck racecheck}
if [ $# -ge 1 ]; then tools=$1; fi
filter=${2:-*}

sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
[ -x "$sanitizer" ] || { echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin)"; exit 2; }
[ -x "$exe" ] || { echo "$exe not built (needs a CUDA build: bash tools/setup.sh)"; exit 2; }
"$exe" --gtest_filter=NoSuchTest > /dev/null 2>&1
[ $? = 77 ] && { echo "no CUDA device: skipped"; exit 77; }

tests=$("$exe" --gtest_list_tests --gtest_filter="$filter" |
        awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }')
[ -n "$tests" ] || { echo "no GPU test matches '$filter'"; exit 2; }

failed=0
for tool in $tools; do
  case $tool in
    memcheck) extra=(--leak-check full) ;;
    racecheck | synccheck | initcheck) extra=() ;;
    *) echo "unknown tool '$tool' (memcheck, racecheck, synccheck, initcheck)"; exit 2 ;;
  esac
  mkdir -p "$out/$tool"
  clean=0 dirty=0
  for t in $tests; do
    log="$out/$tool/$t.log"
    timeout "$timeout_s" "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 86 \
      "$exe" --gtest_filter="$t" > "$log" 2>&1
    rc=$?
    case $rc in
      0) clean=$((clean + 1)); continue ;;
      86) why="sanitizer report: $(grep -m1 -E '^========= (ERROR|WARNING|Error|Invalid|Race|Barrier)' "$log")" ;;
      124) why="timed out after ${timeout_s}s" ;;
      *) why="test failed (exit $rc)" ;;
    esac
    dirty=$((dirty + 1))
    failed=1
    echo "$tool $t: $why  [$log]"
  done
  echo "$tool: $clean clean, $dirty with findings"
done
exit $failed
