#!/usr/bin/env bash
# Install (if needed) and start a local Docker engine, offline-friendly.
#
# Idempotent: exits 0 at once when `docker info` already works.
# Otherwise installs Debian's docker.io (only if `dockerd` is absent) and starts
#   dockerd --iptables=false --bridge=none
# in the background (log: /tmp/dockerd.log, pidfile: /var/run/envfactory-dockerd.pid).
# dockerd starts and supervises its own containerd when no system containerd
# socket is listening, so containerd is not started separately.
#
# No image registry is reachable here: containers must run with --network none
# and base images are built locally (see scripts/base-image.sh).
#
# Env overrides: DOCKERD_LOG, DOCKERD_PIDFILE, DOCKERD_WAIT (seconds, default 60).
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
DOCKERD_PIDFILE="${DOCKERD_PIDFILE:-/var/run/envfactory-dockerd.pid}"
DOCKERD_WAIT="${DOCKERD_WAIT:-60}"

log() { echo "[docker-engine] $*" >&2; }
die() {
    log "ERROR: $*"
    if [ -f "$DOCKERD_LOG" ]; then
        log "---- last 40 lines of $DOCKERD_LOG ----"
        tail -n 40 "$DOCKERD_LOG" >&2 || true
    fi
    exit 1
}

# The docker CLI may live in /usr/local/bin (preinstalled, newer) and/or
# /usr/bin (from docker.io). Either works against the daemon: the client
# negotiates the API version down. Prefer whichever is first on PATH.
docker_cli() {
    if command -v docker >/dev/null 2>&1; then
        command docker "$@"
    else
        /usr/bin/docker "$@"
    fi
}

engine_up() { docker_cli info >/dev/null 2>&1; }

if engine_up; then
    log "engine already running"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    die "must run as root to install/start dockerd"
fi

# PATH may lack sbin dirs in some shells.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

if ! command -v dockerd >/dev/null 2>&1; then
    log "dockerd not found; installing docker.io from Debian"
    t0=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    # Keep the package's postinst from trying to start services itself
    # (there is no systemd here; we start dockerd ourselves below).
    created_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    apt-get update -q
    apt-get install -y -q --no-install-recommends docker.io
    if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    log "docker.io installed in $(( $(date +%s) - t0 ))s"
    command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after install"
fi

if ! command -v docker >/dev/null 2>&1 && [ ! -x /usr/bin/docker ]; then
    die "no docker CLI found (neither on PATH nor /usr/bin/docker)"
fi

# A stale dockerd from an earlier run that is alive but not answering?
if [ -f "$DOCKERD_PIDFILE" ]; then
    oldpid=$(cat "$DOCKERD_PIDFILE" 2>/dev/null || true)
    if [ -n "$oldpid" ] && kill -0 "$oldpid" 2>/dev/null; then
        log "dockerd pid $oldpid alive but not answering yet; waiting for it"
    else
        rm -f "$DOCKERD_PIDFILE"
    fi
fi
# dockerd keeps its own pidfile; a leftover one with a dead pid blocks startup.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid 2>/dev/null)" 2>/dev/null; then
    rm -f /var/run/docker.pid
fi

if [ ! -f "$DOCKERD_PIDFILE" ]; then
    log "starting dockerd (log: $DOCKERD_LOG)"
    t0=$(date +%s)
    : > "$DOCKERD_LOG"
    setsid nohup dockerd --iptables=false --bridge=none \
        >>"$DOCKERD_LOG" 2>&1 < /dev/null &
    echo $! > "$DOCKERD_PIDFILE"
else
    t0=$(date +%s)
fi

pid=$(cat "$DOCKERD_PIDFILE")
deadline=$(( $(date +%s) + DOCKERD_WAIT ))
until engine_up; do
    if ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$DOCKERD_PIDFILE"
        die "dockerd (pid $pid) exited during startup"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        die "docker info did not succeed within ${DOCKERD_WAIT}s (dockerd pid $pid still running)"
    fi
    sleep 0.5
done

log "engine up in $(( $(date +%s) - t0 ))s (dockerd pid $pid)"
docker_cli version --format 'client {{.Client.Version}} / server {{.Server.Version}} (API {{.Server.APIVersion}})' >&2 || true
