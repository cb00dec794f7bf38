#!/usr/bin/env bash
# glm5_next with tensor parallelism on CPU ranks, end to end through `kiln generate` (tests/data/recipes/glm5_next_tiny.toml):
#   - TP=2 as threads (transport.backend = "local") and as two processes (transport.backend = "socket"; kiln starts
#     the second rank itself) generate exactly TP=1's text, for a prompt the scheduler prefills in chunks;
#   - `kiln recipe check` passes the TP=2 recipe and refuses TP=3 naming the field (2 DSA heads for 3 ranks), and so
#     does the load;
#   - decode-context parallelism (TP=2 × DCP=2) as threads and as processes generates TP=1's text; recipe check says
#     what it does, and refuses it on CUDA naming the setting;
#   - with a next-n layer (glm5_next-mtp-kda beside glm5_next-tiny's tokenizer): MTP drafting on TP=2 threads generates
#     TP=1's text, and so it does on rank processes (rank 0's KDA state snapshots and rollbacks are repeated in the
#     other processes' pools); so does MTP drafting under DCP=2.
set -u
kiln=$1 recipe=$2 source_dir=$3
export KILN_RENDEZVOUS_TIMEOUT_S=60
work=$(mktemp -d)
log=$work/log
trap 'rm -rf "$work"' EXIT
die() {
  echo "FAIL: $*"
  tail -n 40 "$log"
  exit 1
}
gen_to() {  # stderr's file, then --set flags
  local err=$1
  shift
  timeout 300 "$kiln" generate --recipe "$recipe" --max-tokens 12 --no-stats \
    --prompt "The kiln fires the clay, and the clay remembers the fire that shaped it, row after row of pots" "$@" 2>>"$err"
}
gen() { gen_to "$log" "$@"; }

one=$(gen) || die "TP=1 generate failed"
[ -n "$one" ] || die "TP=1 generated nothing"
threads=$(gen --set parallel.tensor=2) || die "TP=2 threads failed"
[ "$threads" = "$one" ] || die "TP=2 threads: '$threads' != TP=1 '$one'"
echo "ok: TP=2 threads = TP=1"
procs=$(gen --set parallel.tensor=2 --set transport.backend=socket) || die "TP=2 processes failed"
[ "$procs" = "$one" ] || die "TP=2 processes: '$procs' != TP=1 '$one'"
echo "ok: TP=2 processes = TP=1"

"$kiln" recipe check "$recipe" --set parallel.tensor=2 > "$work/check2" 2>&1 || { cat "$work/check2" >> "$log"; die "recipe check TP=2 failed"; }
grep -q ": ok" "$work/check2" || { cat "$work/check2" >> "$log"; die "recipe check TP=2 did not say ok"; }
if "$kiln" recipe check "$recipe" --set parallel.tensor=3 > "$work/check3" 2>&1; then die "recipe check passed TP=3"; fi
grep -q "parallel.tensor.*num_attention_heads = 2, fewer than the ranks" "$work/check3" ||
  { cat "$work/check3" >> "$log"; die "recipe check TP=3 did not name num_attention_heads"; }
if gen_to "$work/load3" --set parallel.tensor=3 > /dev/null; then die "TP=3 loaded"; fi
grep -q "num_attention_heads = 2" "$work/load3" || { cat "$work/load3" >> "$log"; die "TP=3 load did not name the field"; }
echo "ok: TP=3 refused naming num_attention_heads (recipe check and load)"

# Decode-context parallelism: the DSA layers' latents and indexer rows split by token over the group.
dcp=(--set parallel.tensor=2 --set parallel.decode_context=2)
"$kiln" recipe check "$recipe" "${dcp[@]}" > "$work/checkd" 2>&1 || { cat "$work/checkd" >> "$log"; die "recipe check DCP=2 failed"; }
grep -q "parallel.decode_context.*split the KV cache by token" "$work/checkd" ||
  { cat "$work/checkd" >> "$log"; die "recipe check DCP=2 did not say what the split does"; }
dthreads=$(gen "${dcp[@]}") || die "DCP=2 threads failed"
[ "$dthreads" = "$one" ] || die "DCP=2 threads: '$dthreads' != TP=1 '$one'"
echo "ok: DCP=2 threads = TP=1"
dprocs=$(gen "${dcp[@]}" --set transport.backend=socket) || die "DCP=2 processes failed"
[ "$dprocs" = "$one" ] || die "DCP=2 processes: '$dprocs' != TP=1 '$one'"
echo "ok: DCP=2 processes = TP=1"
if "$kiln" recipe check "$recipe" "${dcp[@]}" --set model.device=cuda > "$work/checkdc" 2>&1; then
  die "recipe check passed decode_context = 2 on CUDA"
fi
grep -q "parallel.decode_context" "$work/checkdc" ||
  { cat "$work/checkdc" >> "$log"; die "recipe check did not refuse decode_context = 2 on CUDA naming it"; }
echo "ok: decode_context = 2 on CUDA refused naming the setting"

mtp_model=$work/mtp
mkdir -p "$mtp_model"
for f in config.json model.safetensors; do
  ln -s "$source_dir/tests/data/models/glm5_next-mtp-kda/$f" "$mtp_model/$f"
done
ln -s "$source_dir/tests/data/models/glm5_next-tiny/tokenizer.json" "$mtp_model/tokenizer.json"
on_mtp=(--set "model.path=\"$mtp_model\"")
draft=(--set speculative.method=mtp --set speculative.depth=2)
one=$(gen "${on_mtp[@]}") || die "mtp fixture TP=1 failed"
drafted=$(gen "${on_mtp[@]}" "${draft[@]}" --set parallel.tensor=2) || die "mtp fixture TP=2 threads with MTP drafting failed"
[ "$drafted" = "$one" ] || die "TP=2 threads with MTP drafting: '$drafted' != TP=1 '$one'"
echo "ok: TP=2 threads with MTP drafting = TP=1"
sock=$(gen "${on_mtp[@]}" "${draft[@]}" --set parallel.tensor=2 --set transport.backend=socket) ||
  die "mtp fixture TP=2 processes with MTP drafting failed"
[ "$sock" = "$one" ] || die "TP=2 processes with MTP drafting: '$sock' != TP=1 '$one'"
echo "ok: TP=2 processes with MTP drafting = TP=1"
dcp_drafted=$(gen "${on_mtp[@]}" "${draft[@]}" "${dcp[@]}") || die "mtp fixture DCP=2 threads with MTP drafting failed"
[ "$dcp_drafted" = "$one" ] || die "DCP=2 threads with MTP drafting: '$dcp_drafted' != TP=1 '$one'"
echo "ok: DCP=2 threads with MTP drafting = TP=1"
echo "ok: glm5_next tensor parallel: all passed"
