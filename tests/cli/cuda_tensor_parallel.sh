#!/usr/bin/env bash
# CUDA tensor parallelism with one process per rank, on one GPU: the ranks share the device and meet through host
# memory (transport.backend = "socket", runtime/cuda/host_staged_collective.h), since NCCL refuses two ranks on one
# GPU. For each fixture (glm4_moe_lite, deepseek_v3, glm_moe_dsa): `kiln generate --prompt-ids` on the fixture's
# prompt, greedy, 16 tokens —
#   - model.device = "cuda", parallel.tensor = 1 gives the fixture's reference continuation (transformers);
#   - parallel.tensor = 2 and 3 (uneven splits: 4 heads as 1 + 1 + 2, 8 experts as 2 + 3 + 3, ...) give the same ids.
# Skips (77) without a GPU.
set -u
kiln=$1 source_dir=$2
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "no GPU visible: skipped"
  exit 77
fi
export KILN_RENDEZVOUS_TIMEOUT_S=120
work=$(mktemp -d)
log=$work/log
trap 'rm -rf "$work"' EXIT
die() {
  echo "FAIL: $*"
  tail -n 80 "$log"
  exit 1
}

# A fixture's int32 tensor from reference.safetensors, as "a,b,c" (sep ",") or "a b c" (sep " ").
ids_of() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
path, name, sep = sys.argv[1], sys.argv[2], sys.argv[3]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    t = header[name]
    assert t["dtype"] == "I32", t
    b, e = t["data_offsets"]
    f.seek(8 + n + b)
    data = f.read(e - b)
print(sep.join(str(v) for v in struct.unpack("<%di" % (len(data) // 4), data)))
PY
}

for fixture in glm4_moe_lite-tiny deepseek_v3-tiny glm_moe_dsa-tiny; do
  dir=$source_dir/tests/data/models/$fixture
  prompt=$(ids_of "$dir/reference.safetensors" prompt_ids ",") || die "$fixture: no prompt_ids"
  want=$(ids_of "$dir/reference.safetensors" greedy_ids " ") || die "$fixture: no greedy_ids"
  cat > "$work/$fixture.toml" <<TOML
[model]
path = "$dir"
device = "cuda"
[scheduler]
max_model_len = 256
TOML
  gen() {
    timeout 300 "$kiln" generate --recipe "$work/$fixture.toml" --prompt-ids "$prompt" --max-tokens 16 --no-stats "$@" \
      2>> "$log"
  }
  one=$(gen) || die "$fixture: TP=1 on CUDA failed"
  [ "$one" = "$want" ] || die "$fixture: TP=1 on CUDA gave '$one', the reference (transformers) '$want'"
  for tp in 2 3; do
    got=$(gen --set parallel.tensor=$tp --set 'transport.backend="socket"') || die "$fixture: TP=$tp on CUDA failed"
    [ "$got" = "$one" ] || die "$fixture: TP=$tp on CUDA gave '$got', TP=1 '$one'"
    echo "ok: $fixture: TP=$tp (rank processes on one GPU) = TP=1 = reference"
  done
done
echo "cuda tensor parallel: all passed"
