#!/usr/bin/env bash
# `kiln bench serve --images 2 --image-size 64` against a CPU `kiln serve` of the tiny vision recipe: every request is a
# chat completion with two new random 64×64 PNGs, answered; TTFT is measured (nonzero) and the prompt tokens (usage)
# include both images' tokens (a 64² image is scaled up to the processor's minimum canvas, 112², grid 8×8: 16 merged
# tokens + begin and end markers each). The same level without --images sends text completions.
set -u
kiln=$1 recipe=$2
log=$(mktemp) out=$(mktemp) text_out=$(mktemp)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -f "$log" "$out" "$text_out"
}
trap cleanup EXIT
die() {
  echo "FAIL: $*"
  cat "$log"
  exit 1
}

"$kiln" serve "$recipe" --port 0 --set model.threads=1 > "$log" 2>&1 &
pid=$!
url=""
for _ in $(seq 1 300); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || die "kiln serve exited"
  sleep 0.1
done
[ -n "$url" ] || die "kiln serve did not start"

"$kiln" bench serve --base-url "$url" --images 2 --image-size 64 --concurrency 1 --num-prompts 2 --input-len 8 \
  --output-len 4 --out "$out" || die "bench serve --images failed"
"$kiln" bench serve --base-url "$url" --concurrency 1 --num-prompts 2 --input-len 8 --output-len 4 \
  --out "$text_out" > /dev/null || die "bench serve (text) failed"
python3 - "$out" "$text_out" <<'PY' || die "unexpected report"
import json, sys
images = json.load(open(sys.argv[1]))
text = json.load(open(sys.argv[2]))
level = images["levels"][0]
assert images["images"] == 2 and images["image_size"] == 64, images
assert level["completed"] == 2 and level["failed"] == 0, level
assert level["ttft"]["mean_ms"] > 0, level
# Two images are 2 × 18 prompt tokens beyond the text: more than the text-only requests by at least that.
image_tokens = level["mean_input_tokens"] - text["levels"][0]["mean_input_tokens"]
assert image_tokens >= 36, (level["mean_input_tokens"], text["levels"][0]["mean_input_tokens"])
print(f"images: TTFT {level['ttft']['mean_ms']:.1f} ms, {level['mean_input_tokens']:.0f} prompt tokens "
      f"({image_tokens:.0f} more than text alone)")
PY
echo "bench serve images: all passed"
