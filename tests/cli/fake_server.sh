# Sourced by the CLI tests that drive a stand-in server: starts `python3 SCRIPT` (which prints "listening on
# http://127.0.0.1:PORT" once it accepts connections), logs to LOG, kills it on exit; sets $url, or fails the test.
start_fake_server() {
  local script=$1 log=$2
  python3 "$script" > "$log" 2>&1 &
  fake_pid=$!
  trap 'kill $fake_pid 2>/dev/null' EXIT
  url=""
  for _ in $(seq 1 100); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
    [ -n "$url" ] && return 0
    sleep 0.1
  done
  echo "FAIL: the fake server did not start"
  cat "$log"
  exit 1
}
