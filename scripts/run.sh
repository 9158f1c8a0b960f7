#!/usr/bin/env bash
# One command for a new user: set everything up on a fresh machine, then run web + bridge + worker.
source "$(dirname "$0")/common.sh"
ensure_venv run
build_native
source "$(dirname "$0")/bridges_conf.sh"
# ENGINE_MODELS="a.gguf,b.gguf": one bridge per file on this machine; the first is the main bridge
# (ENGINE_MODEL), each further one a supervisord program of its own (write_bridges_conf).
IFS=',' read -ra MODELS <<< "${ENGINE_MODELS:-}"
if [ "${#MODELS[@]}" -gt 0 ]; then ENGINE_MODEL="${MODELS[0]}"; fi
MODEL="${ENGINE_MODEL:-$ROOT/models/smollm2-135m-moe16.gguf}"
if [ -x scripts/build_model.sh ]; then
    scripts/build_model.sh "$MODEL" || true
fi
if [ ! -f "$MODEL" ]; then
    MODEL="$ROOT/models/tiny-moe.gguf"
    printf '\n\033[1;33m!! The default model could not be built; falling back to the random-weight fixture model\n!! (%s). Replies will be gibberish: it exists to exercise the protocol.\033[0m\n\n' "$MODEL"
    mkdir -p models
    [ -f "$MODEL" ] || "$PY" native/tools/make_tiny_moe.py "$MODEL"
fi
export ENGINE_MODEL="$MODEL"
build_frontend
redis_up
"$PY" manage.py migrate --noinput -v 0
"$PY" manage.py collectstatic --noinput -v 0
"$PY" manage.py ensure_admin
say "starting web (http://127.0.0.1:${PORT:-8000}/), bridge and worker under supervisord (each restarted if it exits)"
export PORT="${PORT:-8000}" ROOT VENV RUN_DIR="${RUN_DIR:-$ROOT/.run}"
mkdir -p "$RUN_DIR"
write_bridges_conf "$RUN_DIR" "${MODELS[@]:1}"
exec "$VENV/bin/supervisord" -c deploy/supervisord.conf
