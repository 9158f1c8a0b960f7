#!/usr/bin/env bash
# Builds the default model once (cached): scripts/build_model.sh [OUT.gguf]
# The recipe's fingerprint (the builder's sources) is kept beside the file in OUT.recipe, so a
# checkout whose recipe changed rebuilds the default model once instead of serving a stale one.
# Any other existing file (a model of the user's, named by ENGINE_MODEL) is left alone.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEFAULT="$ROOT/models/smollm2-135m-moe16.gguf"
OUT="${1:-$DEFAULT}"
RECIPE="$(cat "$ROOT/native/tools/build_default_model.py" "$ROOT/native/tools/llama_ref.py" | sha256sum | cut -c1-16)"
if [ -f "$OUT" ]; then
    [ "$(realpath -m "$OUT")" != "$(realpath -m "$DEFAULT")" ] && [ ! -f "$OUT.recipe" ] && exit 0
    [ "$(cat "$OUT.recipe" 2>/dev/null)" = "$RECIPE" ] && exit 0
    echo "==> the default model's recipe changed: rebuilding $OUT"
fi
echo "==> building the default model (one time, about 90 s): $OUT"
"$ROOT/.venv/bin/python" "$ROOT/native/tools/build_default_model.py" "$OUT"
echo "$RECIPE" > "$OUT.recipe"
