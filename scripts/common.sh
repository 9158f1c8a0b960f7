# Shared by scripts/run.sh and scripts/test.sh: idempotent setup steps on a fresh machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

say() { printf '\033[1m==> %s\033[0m (%ds)\n' "$*" "$SECONDS"; }

ensure_venv() {
    if [ ! -x "$PY" ]; then
        say "creating virtualenv .venv"
        python3 -m venv "$VENV"
    fi
    # Re-install only when pyproject.toml changed since the last install.
    local stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)-$1"
    if [ ! -f "$stamp" ]; then
        say "installing Python dependencies ($1)"
        "$VENV/bin/pip" install -q --upgrade pip
        if [ "$1" = test ]; then "$VENV/bin/pip" install -q -e '.[test]'; else "$VENV/bin/pip" install -q -e .; fi
        touch "$stamp"
    fi
}

build_native() {
    say "building native engine"
    make -s -C native
}

build_frontend() {
    say "building frontend"
    (cd frontend && { [ -d node_modules ] && [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; } && npm run -s build)
}

redis_up() {
    local url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
    if "$PY" - "$url" <<'PYEOF' 2>/dev/null; then return 0; fi
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping()
PYEOF
    if ! command -v redis-server >/dev/null; then
        say "installing redis-server"
        apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    fi
    say "starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /tmp --logfile /tmp/colibri-redis.log
    for _ in $(seq 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && return 0; sleep 0.1; done
    echo "redis did not start" >&2; return 1
}

postgres_up() {
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then return 0; fi
    if command -v pg_ctlcluster >/dev/null; then
        say "starting PostgreSQL"
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    fi
    for _ in $(seq 50); do pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && return 0; sleep 0.2; done
    echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2; return 1
}

chromium_up() {
    if [ ! -x /usr/bin/chromium ]; then
        say "installing Debian's chromium for the browser tests"
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    fi
}

# Reference files that tests hold our code to, taken from a package on PyPI rather than copied into
# this repository: llama.cpp's model chat templates (gpt-oss's harmony template, Qwen3's), as the
# llama-cpp-python source distribution vendors them. Downloaded once per machine into a cache;
# LLAMA_CPP_SRC points the tests at them (tests/support/reference.py).
LLAMA_CPP_PYTHON_VERSION=0.3.36
reference_up() {
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/colibri/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
    if [ ! -d "$cache/vendor/llama.cpp/models/templates" ]; then
        say "fetching llama.cpp's chat templates (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION source distribution)"
        local tmp
        tmp="$(mktemp -d)"
        "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        mkdir -p "$cache.part"
        tar -xzf "$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$cache.part" --strip-components=1 \
            "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp/models/templates"
        rm -rf "$tmp" "$cache"
        mv "$cache.part" "$cache"
    fi
    export LLAMA_CPP_SRC="$cache/vendor/llama.cpp"
}
