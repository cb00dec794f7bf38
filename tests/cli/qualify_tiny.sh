#!/usr/bin/env bash
# `kiln qualify` on the tiny model with small counts and depths: the card and manifest are written, every artifact's
# SHA-256 in the manifest matches its file, the gates a 10 M-parameter model cannot pass are reported as failed with
# a reason (the decision is reject, exit 3), the server it started drained and exited 0; and the error paths (a
# missing recipe, a server that cannot start) fail with a message and leave no server behind.
set -u
kiln=$1 recipe=$2 out=$3
die() {
  echo "FAIL: $*"
  for f in "$out".stderr "$out".md; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}
rm -f "$out".*

"$kiln" qualify "$recipe" --out "$out" --json-requests 3 --tool-requests 5 --tool-depth 512 --depths 256,1024 \
  --sweep-depths 256 --concurrency 1,2 --num-prompts 2 --output-len 8 > "$out.stdout" 2> "$out.stderr"
rc=$?
[ "$rc" = 3 ] || die "exit status $rc, expected 3 (reject: the tiny model cannot pass every gate)"
[ -s "$out.md" ] || die "no card"
[ -s "$out.json" ] || die "no manifest"

python3 - "$out.json" "$recipe" <<'PY' || die "manifest check failed"
import hashlib, json, sys
m = json.load(open(sys.argv[1]))
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
errors = []
paths = [a["path"] for a in m["artifacts"]]
for a in m["artifacts"]:
    if sha(a["path"]) != a["sha256"]:
        errors.append(f"{a['path']}: sha256 differs from the manifest")
if not any(p.endswith(".md") for p in paths) or not any(p.endswith(".server.log") for p in paths) \
        or not any(p.endswith(".transcript.jsonl") for p in paths):
    errors.append(f"artifacts {paths} lack the card, the server log or the transcript")
if m["recipe_sha256"] != sha(sys.argv[2]):
    errors.append("recipe_sha256 is not the recipe file's")
for key in ("commit", "date", "gpu", "plugins", "checkpoint", "resolved_recipe_sha256"):
    if key not in m or m[key] in ("", None):
        errors.append(f"no {key}")
if len(m["checkpoint"].get("config_json_sha256", "")) != 64:
    errors.append("no config.json digest")
arm = m["arms"][0]
gates = {g["gate"]: g for g in arm["gates"]}
if sorted(gates) != sorted(["smoke", "strict JSON", "tools", "Responses API", "needle", "images"]):
    errors.append(f"gates {sorted(gates)}")
for g in gates.values():
    if g["outcome"] == "FAIL" and not g["reason"]:
        errors.append(f"{g['gate']} failed without a reason")
if gates["images"]["outcome"] != "skipped" or "no image modality" not in gates["images"]["reason"]:
    errors.append(f"images: {gates['images']}")
# A 10 M model does not find a passphrase at depth: reported as failed, each depth with its prompt tokens.
needle = gates["needle"]
if needle["outcome"] != "FAIL" or needle["total"] != 2 or any(c.get("prompt_tokens", 0) <= 0 for c in needle["cases"]):
    errors.append(f"needle: {needle}")
if m["decision"]["verdict"] != "reject" or not m["decision"]["reasons"]:
    errors.append(f"decision {m['decision']}")
if arm["server_exit"] != "exited with status 0" or not arm["capacity"].startswith("KV cache: "):
    errors.append(f"server_exit {arm['server_exit']!r}, capacity {arm['capacity']!r}")
if not arm["depth_sweep"] or len(arm["concurrency_sweep"]) != 2:
    errors.append("sweeps missing")
print("\n".join(errors) or "manifest ok")
sys.exit(1 if errors else 0)
PY
grep -q "^\*\*Decision: reject\*\*" "$out.md" || die "no decision line in the card"
grep -q "^| needle | FAIL 0/2 |" "$out.md" || die "the needle gate is not reported as failed in the card"
grep -q "drained; exiting" "$out.server.log" || die "the server did not drain"

# --against: both qualified, the card compares them gate by gate and on speed; the incumbent's log and transcript are
# artifacts too. Neither passes every gate, so the candidate is at best a challenger.
printf 'extends = "%s"\n[kv]\nlayout = "fp32"\n' "$recipe" > "$out.incumbent.toml"
"$kiln" qualify "$recipe" --against "$out.incumbent.toml" --out "$out.ab" --json-requests 1 --tool-requests 5 \
  --tool-depth 256 --depths 256 --sweep-depths 256 --concurrency 1 --num-prompts 2 --output-len 8 > /dev/null 2> "$out.stderr"
rc=$?
[ "$rc" = 0 ] || [ "$rc" = 3 ] || die "--against: exit status $rc"
grep -q "^\*\*Decision: \(reject\|challenger\)\*\* (against \`[^\`]*incumbent.toml\`)" "$out.ab.md" || die "--against: no decision against the incumbent"
grep -q "^| smoke | pass 1/1 | pass 1/1 |" "$out.ab.md" || die "--against: no gate comparison"
grep -q "^| decode tok/s | [0-9.]* | [0-9.]* |" "$out.ab.md" || die "--against: no speed comparison"
python3 -c 'import json, sys; a = json.load(open(sys.argv[1]))["artifacts"]; sys.exit(sum("incumbent" in x["path"] for x in a) != 2)' \
  "$out.ab.json" || die "--against: incumbent artifacts missing"

# A server that demands an API key: the key its recipe names is the one sent. Only the smoke gate runs, so the best
# decision is challenger (exit 0): promotion needs every applicable gate.
KILN_QUALIFY_KEY=s3cret "$kiln" qualify "$recipe" --set server.api_key_env=KILN_QUALIFY_KEY --gates smoke \
  --out "$out.key" --sweep-depths 64 --concurrency 1 --num-prompts 1 --output-len 4 > /dev/null 2> "$out.stderr"
rc=$?
[ "$rc" = 0 ] || die "API key: exit status $rc"
grep -q "^| smoke | pass 1/1 |" "$out.key.md" && grep -q "^\*\*Decision: challenger\*\*" "$out.key.md" \
  || die "API key: smoke did not pass or the decision is not challenger"

# --base-url: a running server (started here, as an operator would), its capacity read from its /metrics.
"$kiln" serve "$recipe" --port 0 > "$out.running.log" 2>&1 &
spid=$!
url=""
for _ in $(seq 1 300); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$out.running.log" | head -1)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { kill -9 "$spid"; die "kiln serve did not start for --base-url"; }
"$kiln" qualify "$recipe" --base-url "$url" --gates smoke --out "$out.url" --sweep-depths 64 --concurrency 1 \
  --num-prompts 1 --output-len 4 > /dev/null 2> "$out.stderr"
rc=$?
kill -TERM "$spid"
wait "$spid"
[ "$rc" = 0 ] || die "--base-url: exit status $rc"
grep -q "capacity: KV cache: [0-9]* tokens = [0-9.]* windows of 2048 (from the server's /metrics)" "$out.url.md" \
  || die "--base-url: no capacity from /metrics"

# Error paths: a missing recipe; a server that cannot start (its API key variable is unset).
"$kiln" qualify /no/such/recipe.toml --out "$out.missing" > /dev/null 2> "$out.stderr"
rc=$?
[ "$rc" = 1 ] && grep -q "does not exist" "$out.stderr" || die "missing recipe: exit $rc"
"$kiln" qualify "$recipe" --set server.api_key_env=KILN_QUALIFY_UNSET_KEY --out "$out.nostart" > /dev/null 2> "$out.stderr"
rc=$?
[ "$rc" = 1 ] && grep -q "KILN_QUALIFY_UNSET_KEY" "$out.stderr" || die "server that cannot start: exit $rc"
grep -q "^\*\*Decision: reject\*\*" "$out.nostart.md" || die "no card for a server that could not start"

# The server dying mid-run: killed during the tools gate, the gate fails with how it ended, the rest are not run,
# and the card is still written (exit 1).
"$kiln" qualify "$recipe" --out "$out.died" --gates smoke,tools,needle --tool-requests 200 --depths 256 \
  > /dev/null 2> "$out.stderr" &
qpid=$!
for _ in $(seq 1 1200); do grep -q "gate tools" "$out.stderr" && break; sleep 0.1; done
server=$(pgrep -P "$qpid" 2>/dev/null || cat /proc/"$qpid"/task/"$qpid"/children 2>/dev/null)
[ -n "$server" ] || { kill -9 "$qpid"; die "no server child of kiln qualify to kill"; }
kill -9 $server
wait "$qpid"
rc=$?
[ "$rc" = 1 ] || die "exit status $rc after the server was killed, expected 1"
grep -q "^| tools | FAIL [0-9]*/200 | the server was killed by signal 9" "$out.died.md" || die "the killed server is not in the tools gate's reason"
grep -q "^| needle | skipped | not run: the server is gone" "$out.died.md" || die "gates after the death are not marked not run"
echo "qualify tiny: all passed"
