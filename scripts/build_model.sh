#!/usr/bin/env bash
# Builds the default model once (cached): scripts/build_model.sh [OUT.gguf]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/models/smollm2-135m-moe16.gguf}"
[ -f "$OUT" ] && exit 0
echo "==> building the default model (one time, about a minute): $OUT"
"$ROOT/.venv/bin/python" "$ROOT/native/tools/build_default_model.py" "$OUT"
