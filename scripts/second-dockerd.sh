#!/usr/bin/env bash
# A second Docker engine on this machine, for tests and benches that spread worlds over engines.
#
#   bash scripts/second-dockerd.sh start [DIR]   start it (idempotent: exits 0 when it already answers)
#   bash scripts/second-dockerd.sh stop  [DIR]   stop it (SIGTERM, then SIGKILL after 30 s) and remove its
#                                                containers' state; the data root is kept (images cached)
#   bash scripts/second-dockerd.sh url   [DIR]   print its DOCKER_HOST-style URL
#
# DIR (default /tmp/ef-dockerd2) holds its socket (docker.sock), data root (data), exec root
# (exec), pidfile (pid) and log (log). It runs like the first engine (scripts/docker-engine.sh):
#   dockerd --iptables=false --bridge=none
# with its own socket, data root, exec root and pidfile, so the two never share state; it starts
# its own managed containerd under the exec root. Images are not built here: the runtime copies
# an image from the first engine when this one lacks it (envfactory.runtime.pool).
# Needs root and dockerd (scripts/docker-engine.sh installs docker.io). Env: DOCKERD2_WAIT
# (seconds, default 60).
set -euo pipefail

cmd="${1:-start}"
DIR="${2:-${ENVFACTORY_DOCKERD2_DIR:-/tmp/ef-dockerd2}}"
SOCK="$DIR/docker.sock"
URL="unix://$SOCK"
PIDFILE="$DIR/pid"
LOG="$DIR/log"
WAIT="${DOCKERD2_WAIT:-60}"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

log() { echo "[second-dockerd] $*" >&2; }
up() { docker -H "$URL" info >/dev/null 2>&1; }
alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; }

case "$cmd" in
url)
    echo "$URL"
    ;;
start)
    if up; then
        log "engine already running at $URL"
        echo "$URL"
        exit 0
    fi
    [ "$(id -u)" -eq 0 ] || { log "ERROR: must run as root to start dockerd"; exit 1; }
    command -v dockerd >/dev/null 2>&1 || { log "ERROR: no dockerd (run scripts/docker-engine.sh)"; exit 1; }
    mkdir -p "$DIR/data" "$DIR/exec"
    if ! alive; then
        rm -f "$PIDFILE" "$SOCK"
        t0=$(date +%s)
        : > "$LOG"
        setsid nohup dockerd --iptables=false --ip-masq=false --bridge=none \
            --host "$URL" --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$PIDFILE" \
            >>"$LOG" 2>&1 < /dev/null &
        echo $! > "$DIR/launcher.pid"
    fi
    deadline=$(( $(date +%s) + WAIT ))
    until up; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "ERROR: the engine at $URL did not answer within ${WAIT}s; last lines of $LOG:"
            tail -n 30 "$LOG" >&2 || true
            exit 1
        fi
        sleep 0.3
    done
    log "engine up at $URL"
    echo "$URL"
    ;;
stop)
    pid=""
    [ -f "$PIDFILE" ] && pid=$(cat "$PIDFILE" 2>/dev/null || true)
    [ -z "$pid" ] && [ -f "$DIR/launcher.pid" ] && pid=$(cat "$DIR/launcher.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        # only this engine's dockerd: the pid it wrote, checked to be a dockerd on this socket
        if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--host $URL"; then
            kill -TERM "$pid"
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" || true
        else
            log "pid $pid is not this engine's dockerd; left alone"
        fi
    fi
    rm -f "$PIDFILE" "$DIR/launcher.pid" "$SOCK"
    log "stopped"
    ;;
*)
    echo "usage: $0 start|stop|url [DIR]" >&2
    exit 2
    ;;
esac
