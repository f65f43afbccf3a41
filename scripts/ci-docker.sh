#!/usr/bin/env bash
# Docker preparation for CI (run before the tests): engine, base image, environment images.
#   1. scripts/docker-engine.sh   installs docker.io when absent, starts dockerd when none runs
#   2. scripts/base-image.sh      builds envfactory-base:bookworm offline (debootstrap + docker import)
#   3. envfactory image build --all   builds the content-hashed environment image (wheels pinned to
#                                     the installed versions, pip --no-index in the image)
# Idempotent and quick when everything exists (an unchanged image is not rebuilt).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/docker-engine.sh
bash scripts/base-image.sh
python3 -m envfactory.cli image build --all
