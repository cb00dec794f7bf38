#!/usr/bin/env bash
# `kiln recipe show` of GLM-4.7-Flash's shapes (dummy weights, priced for an H200 without one) at parallel.tensor = 2:
# the memory model lists every rank's weights, each rank holds about half of the routed experts' bytes, and the
# weights term (the largest rank's) is well under TP=1's but over half of it (the replicated parts, the shared expert).
set -u
kiln=$1 recipe=$2
show() { "$kiln" recipe show "$recipe" --device-memory-gib 141 "$@" 2>&1; }
one=$(show) || { echo "FAIL: TP=1 show failed"; echo "$one"; exit 1; }
two=$(show --set parallel.tensor=2) || { echo "FAIL: TP=2 show failed"; echo "$two"; exit 1; }
echo "$two" | grep -F "weights per rank (parallel.tensor = 2" || { echo "FAIL: no per-rank weights"; echo "$two"; exit 1; }
echo "$one" | grep -qF "weights per rank" && { echo "FAIL: TP=1 lists ranks"; exit 1; }
python3 - "$one" "$two" <<'PY'
import re, sys
one, two = sys.argv[1], sys.argv[2]
def gib(v, unit): return float(v) / (1024 if unit == "MiB" else 1)
def weights(text):
    m = re.search(r"#     weights: ([0-9.]+) (GiB|MiB)", text)
    return gib(*m.groups())
ranks = re.findall(r"#     rank (\d): [^(]*\(routed experts ([0-9.]+) (GiB|MiB) of ([0-9.]+) (GiB|MiB)\)", two)
assert len(ranks) == 2, ranks
for r, e, eu, f, fu in ranks:
    share = gib(e, eu) / gib(f, fu)
    assert 0.45 < share < 0.55, f"rank {r} holds {share:.3f} of the routed experts"
    print(f"ok: rank {r} holds {share:.3f} of the routed experts ({e} {eu} of {f} {fu})")
w1, w2 = weights(one), weights(two)
assert 0.5 < w2 / w1 < 0.7, f"TP=2 weights {w2:.2f} GiB vs TP=1 {w1:.2f} GiB"
print(f"ok: TP=2 weights term {w2:.2f} GiB (the largest rank) vs {w1:.2f} GiB on one rank")
PY
