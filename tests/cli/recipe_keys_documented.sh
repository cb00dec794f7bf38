#!/usr/bin/env bash
# Every line `kiln recipe keys` prints must appear in configs/README.md, so the documentation names every key
# the code accepts, with its current type, default and meaning.
set -euo pipefail
kiln=$1 readme=$2
missing=0
while IFS= read -r line; do
  [[ "$line" == "| \`"* ]] || continue
  if ! grep -qxF -- "$line" "$readme"; then
    echo "configs/README.md lacks: $line"
    missing=1
  fi
done < <("$kiln" recipe keys)
[ $missing = 0 ] && echo "all recipe keys documented"
exit $missing
