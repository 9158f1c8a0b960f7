#!/usr/bin/env bash
# One command that runs every test: native unit tests, the protocol suite (plain and under
# ASan/UBSan), and the Django/bridge/API/browser suite against Redis, PostgreSQL and the real engine.
source "$(dirname "$0")/common.sh"
ensure_venv test
redis_up
postgres_up
chromium_up
reference_up
export WERROR=1   # native/Makefile: -Werror for every C build the tests use
build_native
# The default model is built here, once, not inside the tests' fixture: its first build (a download
# and a conversion, ~2 min quiet) ran past pytest's 300 s per-test limit on a loaded host.
bash scripts/build_model.sh
build_frontend
export DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/colibri}"
export COLIBRI_DEV=1
"$PY" manage.py collectstatic --noinput -v 0
say "lint (ruff)"
"$VENV/bin/ruff" check .
say "types (mypy)"
"$VENV/bin/mypy"  # [tool.mypy] in pyproject.toml: the app packages, their cache in .mypy_cache
say "native unit tests"
make -s -C native check
say "native protocol suite under AddressSanitizer/UBSan"
make -s -C native asan
# On two workers as the full suite below (a test file per worker): these tests wait on engines.
ASAN_OPTIONS=detect_leaks=0 COLIBRI_ENGINE="$ROOT/native/build-asan/colibri-engine" \
    "$VENV/bin/pytest" -q -p no:cacheprovider -n 2 --dist loadfile tests/native "$@"
say "full suite"
# Two workers, each test file kept on one (--dist loadfile): a file's module fixtures and the
# fixed names some files use (test_budget's cgroups) never meet a copy of themselves. Many tests
# wait on processes and sockets: two workers took the suite from 26 to 17 min on 2 vCPUs.
exec "$VENV/bin/pytest" -q -p no:cacheprovider -n 2 --dist loadfile "$@"
