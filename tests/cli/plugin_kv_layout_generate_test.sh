#!/usr/bin/env bash
# Greedy generation on the CPU through the plugin template's `bf16-copy` KV layout and through the built-in `bf16`:
# both store the same bf16 rows and attend in fp32 the same way but for the order of the multiply-adds (the
# built-in's are vectorised), ~1e-7 relative, so the text must be identical.
set -euo pipefail
kiln=$1 recipe=$2 plugin_dir=$3
prompt="The socket module provides"
generate() {
  "$kiln" generate --recipe "$recipe" --plugin-dir "$plugin_dir" --set kv.layout="$1" --prompt "$prompt" --no-stats
}
builtin=$(generate bf16)
plugin=$(generate bf16-copy)
echo "bf16:      $builtin"
echo "bf16-copy: $plugin"
[[ -n "$builtin" ]] || { echo "FAILED: no text generated"; exit 1; }
[[ "$builtin" == "$plugin" ]] || { echo "FAILED: the texts differ"; exit 1; }
