"""Training checkpoints in safetensors, and resuming from them.

A checkpoint is a folder ``<root>/step-<n>/`` holding:

* ``model.safetensors`` + ``config.json`` (+ the tokenizer): a model folder that
  ``AutoModelForCausalLM.from_pretrained``, :class:`~agents.hf_policy.HFPolicy`
  and vLLM load directly;
* ``optimizer.safetensors``: every tensor of the optimizer state, flattened;
* ``trainer_state.json``: the step, the optimizer's hyper-parameters and
  anything else the trainer needs to take the same next step.

Nothing is pickled: a checkpoint cannot run code when loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint"]

_STEP_DIR = re.compile(r"^step-(\d+)$")


def save_checkpoint(root: str | os.PathLike[str], step: int, *, model: "torch.nn.Module",
                    optimizer: "torch.optim.Optimizer | None", state: dict[str, Any],
                    tokenizer: Any = None, keep: int = 2) -> Path:
    """Write ``<root>/step-<step>`` atomically (a temporary folder renamed into place).

    Args:
        keep: How many most recent checkpoints to keep under ``root`` (0 keeps all).
    """
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    meta: dict[str, Any] = {"step": step, **state}
    if optimizer is not None:
        tensors, opt_meta = _flatten_optimizer(optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        meta["optimizer"] = opt_meta
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if keep:
        for old in sorted(_steps(root))[:-keep]:
            shutil.rmtree(root / f"step-{old}", ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str], *, model: "torch.nn.Module",
                    optimizer: "torch.optim.Optimizer | None" = None) -> dict[str, Any]:
    """Load weights (and optimizer state) from a checkpoint folder into ``model``; return its state.

    Raises:
        FileNotFoundError: ``path`` is not a checkpoint folder.
        ValueError: the weights do not fit ``model``.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "trainer_state.json").exists():
        raise FileNotFoundError(f"{path} is not a checkpoint (no trainer_state.json); pass a step-<n> folder")
    meta = json.loads((path / "trainer_state.json").read_text())
    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    tied |= {k for k in missing if k.endswith("lm_head.weight")
             and getattr(getattr(model, "config", None), "tie_word_embeddings", False)}
    if unexpected or set(missing) - tied:
        raise ValueError(f"checkpoint {path} does not fit the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    if optimizer is not None:
        if "optimizer" not in meta:
            raise ValueError(f"checkpoint {path} holds no optimizer state")
        tensors = load_file(str(path / "optimizer.safetensors"))
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"], optimizer))
    return meta


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The ``step-<n>`` folder with the largest ``n`` under ``root``, or ``None``."""
    steps = _steps(Path(root))
    return Path(root) / f"step-{max(steps)}" if steps else None


def _steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return [int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))
            and (p / "trainer_state.json").exists()]


def _flatten_optimizer(optimizer: "torch.optim.Optimizer") -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
    import torch

    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{idx}.{name}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, "torch.Tensor"], meta: dict[str, Any],
                         optimizer: "torch.optim.Optimizer") -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = v
    for idx, d in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(d)
    groups = meta["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise ValueError("optimizer state has a different number of parameter groups than the optimizer")
    return {"state": state, "param_groups": groups}
