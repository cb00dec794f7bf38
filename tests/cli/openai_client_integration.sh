#!/usr/bin/env bash
# Starts `kiln serve` on a free loopback port and drives it with the official `openai` Python client
# (tools/openai_client_test.py: chat, streaming, prefill progress, tools round trip, Responses, structured output and
# constrained tool_choice, bad requests), then sends
# SIGTERM and checks that the server drains and exits cleanly. Exits 77 (skipped) without the openai package.
set -u
kiln=$1 recipe=$2 client=$3
python3 -c "import openai" 2>/dev/null || { echo "the openai package is not installed: skipped"; exit 77; }
log=$(mktemp)
"$kiln" serve "$recipe" --port 0 > "$log" 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null; rm -f "$log"' EXIT
url=""
for _ in $(seq 1 100); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
  [ -n "$url" ] && break
  kill -0 $pid 2>/dev/null || { echo "kiln serve exited:"; cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "kiln serve did not start:"; cat "$log"; exit 1; }
python3 "$client" --base-url "$url/v1" --expect-prefill-progress
rc=$?
kill -TERM $pid
wait $pid
serve_rc=$?
grep -q "drained; exiting" "$log" || { echo "no clean drain on SIGTERM:"; cat "$log"; exit 1; }
[ $serve_rc = 0 ] || { echo "kiln serve exited with $serve_rc"; cat "$log"; exit 1; }
exit $rc
