#!/usr/bin/env bash
# `kiln bench serve` and `kiln qualify --base-url` against hostile_server.py, whose replies have the wrong JSON shapes:
# each command ends with its own exit status (a failure is fine), never a crash (abort, segfault: status ≥ 128).
set -u
kiln=$1 recipe=$2 fake=$3 out=$4
rm -f "$out".*
. "$(dirname "$0")/fake_server.sh"
start_fake_server "$fake" "$out.fake.log"
# The listing alternates between its two bad shapes; --model skips it and drives the streams.
for i in 1 2 3; do
  model=()
  [ "$i" = 3 ] && model=(--model m)
  "$kiln" bench serve --base-url "$url" "${model[@]}" --concurrency 1,2 --num-prompts 2 --input-len 8 --output-len 4 \
    --out "$out.bench$i.json" > "$out.bench$i.stdout" 2> "$out.bench$i.stderr"
  rc=$?
  [ "$rc" -lt 128 ] || { echo "FAIL: kiln bench serve died with status $rc"; cat "$out.bench$i.stderr"; exit 1; }
done
"$kiln" qualify "$recipe" --base-url "$url" --out "$out.qualify" --json-requests 1 --tool-requests 1 --depths 100 \
  --sweep-depths 100 --concurrency 1 --output-len 4 > /dev/null 2> "$out.qualify.stderr"
rc=$?
[ "$rc" -lt 128 ] || { echo "FAIL: kiln qualify died with status $rc"; cat "$out.qualify.stderr"; exit 1; }
echo "hostile server replies: no crash"
