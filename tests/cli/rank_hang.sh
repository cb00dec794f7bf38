#!/usr/bin/env bash
# A rank process that hangs inside a step (KILN_TEST_HANG_STEP: alive, asleep, never reaching the others), under
# `kiln serve` with TP=2 over `socket` and transport.timeout_s = 3:
#   - the request in flight fails within the bound + slack (not the 300 s default) with HTTP 503 (the group is gone:
#     no fault of the request, and not a 500), whose message names the collective, the call and the rank that did not
#     arrive;
#   - the launcher stops the rank processes (the hung one included) at once, the server lives on (/health), and
#     later requests fail with 503 saying the group is broken.
set -u
kiln=$1 tiny=$2
export KILN_RENDEZVOUS_TIMEOUT_S=60
work=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
die() {
  echo "FAIL: $*"
  tail -n 40 "$work/serve.log"
  exit 1
}
export KILN_TEST_HANG_STEP="1:60:$work/hang"
"$kiln" serve "$tiny" --port 0 --set parallel.tensor=2 --set 'transport.backend="socket"' --set transport.timeout_s=3 \
  > "$work/serve.log" 2>&1 &
pid=$!
unset KILN_TEST_HANG_STEP
url=""
for _ in $(seq 1 300); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || die "kiln serve exited"
  sleep 0.1
done
[ -n "$url" ] || die "kiln serve did not start"
chat() {
  curl -s --max-time 60 -o "$work/reply" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model": "tiny-glm", "messages": [{"role": "user", "content": "What does a kiln do?"}], "max_tokens": 8, "temperature": 0}'
}
[ "$(chat)" = 200 ] || die "TP=2 chat failed: $(cat "$work/reply")"
child=$(pgrep -P "$pid")
[ -n "$child" ] || die "no rank process under kiln serve"

touch "$work/hang"
t0=$(date +%s)
code=$(chat)
took=$(( $(date +%s) - t0 ))
[ -e "$work/hang" ] && die "rank 1 did not take the injected hang"
[ "$took" -lt 12 ] || die "the request took $took s with transport.timeout_s = 3"
# A broken group is a service that is gone, not an internal error: 503.
[ "$code" = 503 ] || die "HTTP $code (want 503): $(cat "$work/reply")"
grep -qF '"service_unavailable"' "$work/reply" || die "the error's type is not service_unavailable: $(cat "$work/reply")"
for want in "collective \`socket\`" " in call " "rank 1 did not arrive within transport.timeout_s = 3 s"; do
  grep -qF -- "$want" "$work/reply" || die "the error lacks '$want': $(cat "$work/reply")"
done
echo "ok: a hung rank fails the request in $took s (HTTP $code), naming it"
for _ in $(seq 1 50); do
  kill -0 "$child" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$child" 2>/dev/null && die "the hung rank process $child was not stopped"
grep -qF "stopping the rank process(es) of this machine, rank(s) 1" "$work/serve.log" || die "the launcher did not say it stopped rank 1"
curl -sf --max-time 10 "$url/health" > /dev/null || die "the server stopped answering"
code=$(chat)
[ "$code" = 503 ] || die "a later request: HTTP $code (want 503) $(cat "$work/reply")"
grep -qF "broken" "$work/reply" || die "a later request does not say the group is broken: $(cat "$work/reply")"
echo "ok: the launcher stopped the hung rank; the server answers, later requests fail with the broken group"
kill -TERM "$pid"
wait "$pid"
pid=""
exit 0
