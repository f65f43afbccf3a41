#!/usr/bin/env bash
# Install envfactory and its Python dependencies into the current Python, offline-friendly.
# torch is pinned to the CPU build first: a looser requirement would pull several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check "torch==2.13.0"
$PY -m pip install -q --disable-pip-version-check -e ".[dev,docker,train,eval]"
