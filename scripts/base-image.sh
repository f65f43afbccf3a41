#!/usr/bin/env bash
# Build the local envfactory base image, offline (no image registry needed).
#
#   scripts/base-image.sh [NAME]        # default NAME: envfactory-base:bookworm
#
# Idempotent: exits 0 at once if the image already exists.
# Otherwise: debootstrap a minbase Debian bookworm with python3 + python3-venv,
# add a venv at /opt/venv (on PATH) whose `pip` runs Debian's bundled pip wheel
# (no pip copy installed: the smallest working option), add user envf
# (uid/gid 10001), trim docs/locales/apt lists, and `docker import` it.
#
# Cache: /var/cache/envfactory/debs (downloaded .debs, reused by debootstrap)
#        /var/cache/envfactory/rootfs-<key>.tar (finished rootfs; a re-run
#        with a missing image only re-imports this: a few seconds).
#
# In the image:
#   python3        -> /opt/venv/bin/python3 (Python 3.11, Debian bookworm)
#   pip / pip3     -> install into /opt/venv; use as root at build time, e.g.
#                     RUN pip install --no-index --find-links /wheels pydantic
#                     (`python3 -m pip` is NOT available; use `pip`.)
#   user envf      -> uid 10001, gid 10001, home /home/envf
#   default USER   -> root (so derived Dockerfiles can pip install); run
#                     containers with --user 10001.
#
# Env overrides: ENVFACTORY_CACHE_DIR, DEBIAN_MIRROR, ENVFACTORY_SKIP_ENGINE=1 (do not
# call scripts/docker-engine.sh first).
set -euo pipefail

NAME="${1:-envfactory-base:bookworm}"
SUITE=bookworm
PACKAGES="python3,python3-venv"
IMAGE_UID=10001
CACHE_DIR="${ENVFACTORY_CACHE_DIR:-/var/cache/envfactory}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Bump RECIPE_VERSION when the customisation below changes, so the cached
# rootfs tarball is rebuilt.
RECIPE_VERSION=1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "[base-image] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot)"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

if [ "${ENVFACTORY_SKIP_ENGINE:-0}" != 1 ]; then
    "$here/docker-engine.sh"
fi

if docker image inspect "$NAME" >/dev/null 2>&1; then
    log "image $NAME already exists"
    exit 0
fi

t_start=$(date +%s)
mkdir -p "$CACHE_DIR/debs"

# Serialise concurrent builds (e.g. parallel test runs).
exec 9>"$CACHE_DIR/.lock"
flock 9
if docker image inspect "$NAME" >/dev/null 2>&1; then
    log "image $NAME was built by a concurrent run"
    exit 0
fi

key=$(printf '%s|%s|%s|%s\n' "$SUITE" "$PACKAGES" "$IMAGE_UID" "$RECIPE_VERSION" | sha256sum | cut -c1-12)
tarball="$CACHE_DIR/rootfs-$SUITE-$key.tar"

if [ ! -s "$tarball" ]; then
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends debootstrap
    fi

    work=$(mktemp -d /var/tmp/envfactory-rootfs.XXXXXX)
    rootfs="$work/rootfs"
    cleanup() {
        # debootstrap unmounts proc/sys itself, but be safe after a failure.
        for m in proc sys dev/pts dev; do
            mountpoint -q "$rootfs/$m" 2>/dev/null && umount -l "$rootfs/$m" || true
        done
        rm -rf "$work"
    }
    trap cleanup EXIT

    log "debootstrap --variant=minbase --include=$PACKAGES $SUITE (log: $work/debootstrap.log)"
    t0=$(date +%s)
    if ! debootstrap --variant=minbase --include="$PACKAGES" \
            --cache-dir="$CACHE_DIR/debs" \
            "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
        tail -n 40 "$work/debootstrap.log" >&2
        [ -f "$rootfs/debootstrap/debootstrap.log" ] && tail -n 40 "$rootfs/debootstrap/debootstrap.log" >&2
        die "debootstrap failed"
    fi
    log "debootstrap done in $(( $(date +%s) - t0 ))s"

    # --- customise -----------------------------------------------------------
    pip_whl=$(cd "$rootfs" && ls usr/share/python-wheels/pip-*.whl 2>/dev/null | head -n1)
    [ -n "$pip_whl" ] || die "no pip wheel in /usr/share/python-wheels (python3-venv missing?)"

    chroot "$rootfs" /usr/bin/python3 -m venv --without-pip /opt/venv
    for p in pip pip3; do
        cat > "$rootfs/opt/venv/bin/$p" <<EOF
#!/bin/sh
# Runs Debian's bundled pip wheel with the venv's python: installs into /opt/venv.
exec /opt/venv/bin/python3 /$pip_whl/pip "\$@"
EOF
        chmod 755 "$rootfs/opt/venv/bin/$p"
    done
    # sanity check
    chroot "$rootfs" /opt/venv/bin/pip --version >/dev/null

    chroot "$rootfs" groupadd -g "$IMAGE_UID" envf
    chroot "$rootfs" useradd -u "$IMAGE_UID" -g "$IMAGE_UID" -m -d /home/envf -s /bin/sh envf

    # Trim: nothing in the image can reach a network, so apt lists/caches are
    # dead weight; docs/man/locales are never read.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb \
           "$rootfs"/var/cache/apt/*.bin \
           "$rootfs"/var/lib/apt/lists/* \
           "$rootfs"/usr/share/doc/* \
           "$rootfs"/usr/share/man/* \
           "$rootfs"/usr/share/info/* \
           "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* \
           "$rootfs"/debootstrap
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    # Docker provides these at run time.
    : > "$rootfs/etc/resolv.conf"
    : > "$rootfs/etc/hostname"

    log "writing $tarball"
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    cleanup
    trap - EXIT
    # Keep only the current rootfs tarball.
    find "$CACHE_DIR" -maxdepth 1 -name "rootfs-*.tar" ! -name "$(basename "$tarball")" -delete
else
    log "using cached rootfs $tarball"
fi

log "docker import -> $NAME"
t0=$(date +%s)
docker import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_NO_INDEX=1' \
    --change 'ENV PIP_NO_CACHE_DIR=1' \
    --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
    --change "LABEL org.envfactory.base.recipe=$key" \
    --change 'WORKDIR /home/envf' \
    --change 'CMD ["python3"]' \
    --message "envfactory base ($SUITE minbase + python3, recipe $key)" \
    "$tarball" "$NAME" >/dev/null
log "import done in $(( $(date +%s) - t0 ))s"

size=$(docker image inspect --format '{{.Size}}' "$NAME")
log "built $NAME in $(( $(date +%s) - t_start ))s, size $(( size / 1024 / 1024 )) MiB"
