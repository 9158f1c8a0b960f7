# Sourced by scripts/run.sh (and tests/web/test_process_manager.py): the supervisord programs of
# the bridges past the first when ENGINE_MODELS lists several model files on one machine.
#
# write_bridges_conf RUN_DIR [MODEL_FILE ...] writes RUN_DIR/bridges.conf, which
# deploy/supervisord.conf includes: one [program:bridge-<id>] per file, BRIDGE_ID=<id> (the file's
# stem as the served model id spells it: lower case, [a-z0-9._-]) and ENGINE_MODEL=<file>; the
# main bridge is deploy/supervisord.conf's own [program:bridge]. A file that does not exist is
# skipped, and said so. With no file the config holds only its comment line.
write_bridges_conf() {
    local conf="$1/bridges.conf" model id
    shift
    printf '; written by scripts/run.sh at each start: the bridges of ENGINE_MODELS past the first\n' > "$conf"
    for model in "$@"; do
        if [ ! -f "$model" ]; then
            printf '\033[1;33m!! ENGINE_MODELS: %s does not exist; no bridge for it\033[0m\n' "$model" >&2
            continue
        fi
        id="$(basename "$model" .gguf | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9._-]/-/g')"
        printf '\033[1m==> another bridge: %s (%s)\033[0m\n' "$id" "$model"
        cat >> "$conf" <<EOF
[program:bridge-$id]
command=%(ENV_VENV)s/bin/python manage.py run_bridge
environment=BRIDGE_ID="$id",ENGINE_MODEL="$model"
directory=%(ENV_ROOT)s
autorestart=true
startsecs=1
startretries=1000
stopsignal=TERM
stopwaitsecs=45
stopasgroup=true
killasgroup=true
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true

EOF
    done
}
