#!/usr/bin/env bash
# One process per rank (transport.backend = "socket"; kiln starts the ranks itself):
#   - `kiln generate` greedy output with TP=2, DCP=2 and TP=4×DCP=2 in 2 and 4 processes equals TP=1's and the
#     ranks-as-threads run's, on the tiny model and on the DSA fixture (another shape: 4 heads, hidden 64, indexer);
#   - the same with MTP speculative decoding (next-n steps forwarded to the ranks);
#   - `--nnodes 2` run as two invocations on localhost (node-rank 0 and 1) gives the same output, and so do two
#     processes started with the torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
#   - `kiln serve` with TP=2 answers a chat completion exactly as TP=1 does;
#   - a rank that fails at start-up ends the launch within seconds (not the rendezvous timeout), naming the rank,
#     its exit status and its last lines, and stopping the other ranks; with ranks started by torchrun-style
#     variables (no launcher), rank 0 names the rank that could not build its shard;
#   - a step that fails on one rank (KILN_TEST_FAIL_STEP) fails that request naming the rank, and the next request
#     equals TP=1's again (TP=2, and TP=4×DCP=2 with the failure on a rank of the second decode-context group);
#   - killing a rank process makes requests fail with an error naming the rank (no hang), and the server lives on;
#   - the rank processes exit with rank 0.
set -u
kiln=$1 tiny=$2 source_dir=$3
export KILN_RENDEZVOUS_TIMEOUT_S=60
work=$(mktemp -d)
log=$work/log
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
die() {
  echo "FAIL: $*"
  tail -n 60 "$log"
  exit 1
}

gen() {  # recipe, then --set flags
  local recipe=$1
  shift
  timeout 300 "$kiln" generate --recipe "$recipe" --prompt "The kiln fires the clay, and the clay" --max-tokens 12 \
    --no-stats "$@" 2>>"$log"
}
socket="--set transport.backend=socket"
# A base port with 4 free ports from it (collective, control channel, decode-context groups), below the kernel's
# ephemeral range: a port there can go to any outgoing connection (the ranks' own) before rank 0 listens on it.
free_ports() {
  python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    base = random.randint(20000, max(20004, low - 8))
    try:
        for p in range(base, base + 4):
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", p)); s.close()
        print(base); break
    except OSError:
        continue
PY
}

# The DSA fixture with the tiny model's tokenizer (the same 4,096-token vocabulary).
dsa=$work/dsa
mkdir -p "$dsa"
ln -s "$source_dir/tests/data/models/glm_moe_dsa-tiny/config.json" "$dsa/config.json"
ln -s "$source_dir/tests/data/models/glm_moe_dsa-tiny/model.safetensors" "$dsa/model.safetensors"
ln -s "$source_dir/models/tiny-glm/tokenizer.json" "$dsa/tokenizer.json"
cat > "$work/dsa.toml" <<TOML
[model]
path = "$dsa"
device = "cpu"
threads = 1
[kv]
block_size = 16
[scheduler]
max_model_len = 256
max_num_seqs = 4
TOML

for recipe in "$tiny" "$work/dsa.toml"; do
  one=$(gen "$recipe") || die "TP=1 generate failed ($recipe)"
  [ -n "$one" ] || die "TP=1 generated nothing"
  for par in "--set parallel.tensor=2" "--set parallel.tensor=2 --set parallel.decode_context=2" \
             "--set parallel.tensor=4 --set parallel.decode_context=2"; do
    threads=$(eval gen "$recipe" $par) || die "threads $par failed ($recipe)"
    procs=$(eval gen "$recipe" $par $socket) || die "processes $par failed ($recipe)"
    [ "$threads" = "$one" ] || die "threads $par: '$threads' != TP=1 '$one' ($recipe)"
    [ "$procs" = "$one" ] || die "processes $par: '$procs' != TP=1 '$one' ($recipe)"
    echo "ok: $recipe $par: processes = threads = TP=1"
  done
  # Two nodes on this machine: the same command with --node-rank 0 and 1.
  port=$(free_ports)
  nodes="--set parallel.tensor=4 $socket --nnodes 2 --master-addr 127.0.0.1 --master-port $port"
  eval gen "$recipe" $nodes --node-rank 1 > "$work/node1.out" &
  node1=$!
  node0=$(eval gen "$recipe" $nodes --node-rank 0) || die "--nnodes 2 node 0 failed ($recipe)"
  wait "$node1" || die "--nnodes 2 node 1 failed ($recipe)"
  [ "$node0" = "$one" ] || die "--nnodes 2: '$node0' != TP=1 '$one' ($recipe)"
  [ -s "$work/node1.out" ] && die "node 1 printed a completion: $(cat "$work/node1.out")"
  echo "ok: $recipe --nnodes 2 on localhost = TP=1"
done

# torchrun-style: each rank started by someone else with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set.
port=$(free_ports)
env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$kiln" generate --recipe "$tiny" --prompt "The kiln fires the clay, and the clay" --max-tokens 12 --no-stats \
  --set parallel.tensor=2 --set transport.backend=socket > "$work/rank1.out" 2>>"$log" &
rank1=$!
one=$(gen "$tiny") || die "TP=1 generate failed"
env0=$(RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port gen "$tiny" --set parallel.tensor=2 $socket) ||
  die "rank 0 started with RANK/WORLD_SIZE failed"
wait "$rank1" || die "rank 1 started with RANK/WORLD_SIZE failed"
[ "$env0" = "$one" ] || die "ranks from the environment: '$env0' != TP=1 '$one'"
[ -s "$work/rank1.out" ] && die "rank 1 printed a completion"
echo "ok: ranks started with torchrun-style variables = TP=1"

# Speculative decoding with the MTP drafter: its next-n steps and the target's lm_head / embedding cross to the
# ranks too, and drafting is lossless, so the output is TP=1's without drafting.
mtp="--set speculative.method=mtp --set speculative.depth=2"
procs=$(eval gen "$tiny" $mtp --set parallel.tensor=2 $socket) || die "processes with MTP drafting failed"
[ "$procs" = "$one" ] || die "processes with MTP drafting: '$procs' != TP=1 '$one'"
echo "ok: TP=2 processes with MTP drafting = TP=1"

# A rank that fails at start-up: the launch ends at once (KILN_RENDEZVOUS_TIMEOUT_S is 60 here), naming it.
startup_fails() {  # KILN_TEST_FAIL_LOAD value, then more flags; leaves stderr in $work/startup.err, seconds in $took
  local marker="startup-$$-$RANDOM" t0
  t0=$(date +%s)
  if env KILN_TEST_FAIL_LOAD="$1" timeout 120 "$kiln" generate --recipe "$tiny" --prompt "x" --max-tokens 2 --no-stats \
       --set "model.served_name=\"$marker\"" "${@:2}" > /dev/null 2> "$work/startup.err"; then
    cat "$work/startup.err" >> "$log"
    die "KILN_TEST_FAIL_LOAD=$1: the launch succeeded"
  fi
  took=$(( $(date +%s) - t0 ))
  cat "$work/startup.err" >> "$log"
  [ "$took" -lt 20 ] || die "KILN_TEST_FAIL_LOAD=$1: the launch took $took s to fail"
  sleep 1
  pgrep -f "$marker" > /dev/null && die "KILN_TEST_FAIL_LOAD=$1: rank processes outlived the failed launch: $(pgrep -af "$marker")"
  return 0
}
expect_err() { grep -qF -- "$1" "$work/startup.err" || die "start-up failure: no '$1' in: $(cat "$work/startup.err")"; }
startup_fails 1:rendezvous --set parallel.tensor=4 $socket
expect_err "rank 1 (pid"
expect_err "exited with status 1 while the ranks were starting"
expect_err "injected start-up failure at rendezvous"
expect_err "stopping the other rank(s) of this machine: 2, 3"
echo "ok: a rank failing before the rendezvous ends the launch in $took s, naming it"
startup_fails 2:build --set parallel.tensor=4 $socket
expect_err "rank 2"
expect_err "injected start-up failure at build"
echo "ok: a rank failing to build its shard ends the launch in $took s, naming it"
# No launcher (torchrun-style): rank 0 hears it from the rank itself over the control channel.
port=$(free_ports)
env KILN_TEST_FAIL_LOAD=1:build RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$kiln" generate --recipe "$tiny" --prompt "x" --max-tokens 2 --no-stats --set parallel.tensor=2 $socket \
  > /dev/null 2>> "$log" &
rank1=$!
t0=$(date +%s)
if env KILN_TEST_FAIL_LOAD=1:build RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
     timeout 120 "$kiln" generate --recipe "$tiny" --prompt "x" --max-tokens 2 --no-stats --set parallel.tensor=2 $socket \
     > /dev/null 2> "$work/startup.err"; then
  die "rank 0 started although rank 1 could not build its shard"
fi
took=$(( $(date +%s) - t0 ))
cat "$work/startup.err" >> "$log"
wait "$rank1" && die "rank 1 exited 0 after failing to build"
[ "$took" -lt 20 ] || die "rank 0 took $took s to give up on rank 1"
expect_err "tensor-parallel rank 1 could not load"
expect_err "injected start-up failure at build"
echo "ok: ranks from the environment: rank 0 names the rank that could not load, in $took s"

# kiln serve.
start_server() {
  # The redirect below runs in the background child: until it truncates the file, the previous server's log (and its
  # URL) would still be there for the grep. Removed here, in this shell, first.
  rm -f "$work/serve.log"
  "$kiln" serve "$tiny" --port 0 "$@" > "$work/serve.log" 2>&1 &
  pid=$!
  url=""
  for _ in $(seq 1 300); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" 2>/dev/null | head -1)
    [ -n "$url" ] && return
    kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >> "$log"; die "kiln serve exited"; }
    sleep 0.1
  done
  cat "$work/serve.log" >> "$log"
  die "kiln serve did not start"
}
chat() {
  curl -s --max-time 60 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model": "tiny-glm", "messages": [{"role": "user", "content": "What does a kiln do?"}], "max_tokens": 16, "temperature": 0}'
}
content() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'; }
stop_server() {
  kill -TERM "$pid"
  wait "$pid"
  pid=""
}

start_server
want=$(chat | content) || die "TP=1 chat failed"
stop_server

start_server --set parallel.tensor=2 --set 'transport.backend="socket"'
children=$(pgrep -P "$pid")
[ "$(echo "$children" | wc -w)" = 1 ] || die "expected one rank process under kiln serve, found: $children"
got=$(chat | content) || die "TP=2 chat failed"
[ "$got" = "$want" ] || die "serve TP=2 answered '$got', TP=1 '$want'"
echo "ok: serve TP=2 (2 processes) = TP=1"

# A step that fails on one rank fails that request, naming the rank, and the group goes on: the next request is
# TP=1's again. TP=2 (rank 1), and TP=4 × DCP=2 with rank 3 (in the second decode-context group) failing.
stop_server
for par in "2 1 --set parallel.tensor=2" "4 3 --set parallel.tensor=4 --set parallel.decode_context=2"; do
  set -- $par
  ranks=$1 failing=$2
  shift 2
  export KILN_TEST_FAIL_STEP="$failing:$work/fail-step"
  start_server "$@" --set 'transport.backend="socket"'
  unset KILN_TEST_FAIL_STEP
  got=$(chat | content) || die "TP=$ranks chat failed"
  [ "$got" = "$want" ] || die "serve $par answered '$got', TP=1 '$want'"
  touch "$work/fail-step"
  t0=$(date +%s)
  reply=$(chat)
  [ $(( $(date +%s) - t0 )) -lt 30 ] || die "the failed request took $(( $(date +%s) - t0 )) s"
  [ -e "$work/fail-step" ] && die "rank $failing did not take the injected failure"
  echo "$reply" | grep -q "tensor-parallel rank $failing" || { echo "$reply" >> "$log"; die "the error does not name rank $failing: $reply"; }
  echo "$reply" | grep -q "injected step failure" || { echo "$reply" >> "$log"; die "the error does not say why: $reply"; }
  got=$(chat | content) || { cat "$work/serve.log" >> "$log"; die "the request after a failed one failed ($par)"; }
  [ "$got" = "$want" ] || die "after a failed request, serve $par answered '$got', TP=1 '$want'"
  [ "$(pgrep -P "$pid" | wc -w)" = $(( ranks - 1 )) ] || die "rank processes are gone after a failed call ($par)"
  echo "ok: serve $par: a step failing on rank $failing fails that request only; the next = TP=1"
  stop_server
done
start_server --set parallel.tensor=2 --set 'transport.backend="socket"'
children=$(pgrep -P "$pid")

# A rank process that dies: the request fails with an error naming the rank, quickly; later ones too; no hang.
kill -9 $children
t0=$(date +%s)
reply=$(chat)
[ $(( $(date +%s) - t0 )) -lt 30 ] || die "the request after a rank died took $(( $(date +%s) - t0 )) s"
echo "$reply" | grep -q 'rank 1' || { echo "$reply" >> "$log"; die "the error does not name rank 1: $reply"; }
reply=$(chat)
echo "$reply" | grep -q 'broken' || { echo "$reply" >> "$log"; die "a later request did not fail with the broken group: $reply"; }
curl -s --max-time 10 "$url/health" > /dev/null || die "the server stopped answering"
echo "ok: a dead rank fails requests naming it"
stop_server

# Rank 0 exiting ends its rank processes (stop message; PR_SET_PDEATHSIG for a kill).
start_server --set parallel.tensor=2 --set 'transport.backend="socket"'
children=$(pgrep -P "$pid")
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=""
for _ in $(seq 1 50); do
  kill -0 $children 2>/dev/null || break
  sleep 0.1
done
kill -0 $children 2>/dev/null && die "rank process $children outlived a killed rank 0"
echo "ok: rank processes exit with rank 0"
exit 0
