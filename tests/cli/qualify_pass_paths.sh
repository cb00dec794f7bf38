#!/usr/bin/env bash
# `kiln qualify --base-url` against qualify_fake_server.py, which answers every gate correctly: the passing path of each
# gate (schema-valid JSON, parallel and streamed tool calls, the Responses round trip, an exact needle) and the
# promote decision (exit 0), which the tiny model never reaches.
set -u
kiln=$1 recipe=$2 fake=$3 out=$4
rm -f "$out".*
. "$(dirname "$0")/fake_server.sh"
start_fake_server "$fake" "$out.fake.log"
"$kiln" qualify "$recipe" --base-url "$url" --out "$out" --json-requests 6 --tool-requests 10 --depths 500,2000 \
  --sweep-depths 200 --concurrency 1,2 --output-len 8 > /dev/null 2> "$out.stderr"
rc=$?
[ "$rc" = 0 ] || { echo "FAIL: exit status $rc"; cat "$out.stderr" "$out.md"; exit 1; }
for row in "smoke | pass 1/1" "strict JSON | pass 6/6" "tools | pass 10/10" "Responses API | pass 3/3" \
           "needle | pass 2/2" "images | skipped"; do
  grep -q "^| $row |" "$out.md" || { echo "FAIL: no row \`$row\`"; cat "$out.md"; exit 1; }
done
grep -q "^\*\*Decision: promote\*\*" "$out.md" || { echo "FAIL: not promoted"; cat "$out.md"; exit 1; }
echo "qualify pass paths: all passed"
