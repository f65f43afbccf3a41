"""Training checkpoints in safetensors, and resuming from them.

A checkpoint is a folder ``<root>/step-<n>/`` holding:

* ``model.safetensors`` + ``config.json`` (+ the tokenizer): a model folder that
  ``AutoModelForCausalLM.from_pretrained``, :class:`~agents.policies.hf_policy.HFPolicy`
  and vLLM load directly (with a learner per role: one such folder per learner);
* ``optimizer.safetensors`` + ``optimizer.json``: the optimizer state, flattened;
* ``reference.safetensors``: the frozen reference model of a KL penalty, if any;
* ``trainer_state.json``: the step and anything else the trainer needs to take
  the same next step.

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


def save_checkpoint(root: str | os.PathLike[str], step: int, parts: dict[str, dict[str, Any]], *,
                    state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``<root>/step-<step>`` atomically (a temporary folder renamed into place).

    Args:
        parts: ``folder -> {"model", "optimizer", "tokenizer", "reference"}`` (optimizer,
            tokenizer and reference model optional); folder ``""`` is the checkpoint's top,
            so a one-model checkpoint is itself a model folder. Each part's folder holds
            ``model.safetensors`` + ``config.json``, ``optimizer.safetensors`` +
            ``optimizer.json``, and ``reference.safetensors`` (a KL anchor).
        state: Saved in ``trainer_state.json`` with the step.
        keep: How many most recent checkpoints to keep under ``root`` (0 keeps all).
    """
    from safetensors.torch import save_file

    from agents.models.parallel import barrier, full_state_dict, rank

    root = Path(root)
    final = root / f"step-{step}"
    # every rank gathers (a sharded model's full state is assembled from all of them); rank 0 writes
    gathered = {sub: (full_state_dict(p["model"], p.get("optimizer")),
                      full_state_dict(p["reference"])[0] if p.get("reference") is not None else None)
                for sub, p in parts.items()}
    if rank() != 0:
        barrier()
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for sub, p in parts.items():
        d = tmp / sub
        (model_state, opt_state), ref_state = gathered[sub]
        p["model"].save_pretrained(d, safe_serialization=True, state_dict=model_state)
        if p.get("tokenizer") is not None:
            p["tokenizer"].save_pretrained(d)
        if opt_state is not None:
            tensors, opt_meta = _flatten_optimizer(opt_state)
            save_file(tensors, str(d / "optimizer.safetensors"))
            (d / "optimizer.json").write_text(json.dumps(opt_meta))
        if ref_state is not None:
            save_file(_untied(ref_state), str(d / "reference.safetensors"))
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state, "parts": sorted(parts)}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if keep:
        for old in sorted(_steps(root))[:-keep]:
            shutil.rmtree(root / f"step-{old}", ignore_errors=True)
    barrier()
    return final


def _untied(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """A state dict safetensors can write: tensors that share memory (tied weights) written once each."""
    seen: dict[int, str] = {}
    out = {}
    for k, v in state.items():
        ptr = v.data_ptr()
        if ptr in seen and v.numel():
            continue
        seen[ptr] = k
        out[k] = v.detach().cpu().contiguous()
    return out


def load_checkpoint(path: str | os.PathLike[str], parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Load each part's weights (and optimizer state, and reference model when the part
    names one and the checkpoint has it) from a checkpoint folder; return its state.

    Raises:
        FileNotFoundError: ``path`` is not a checkpoint folder.
        ValueError: the weights do not fit, or the checkpoint lacks a part or its optimizer.
    """
    from safetensors.torch import load_file

    from agents.models.parallel import load_full_state_dict

    path = Path(path)
    if not (path / "trainer_state.json").exists():
        raise FileNotFoundError(f"{path} is not a checkpoint (no trainer_state.json); pass a step-<n> folder")
    meta = json.loads((path / "trainer_state.json").read_text())
    if sorted(parts) != meta.get("parts", [""]):
        raise ValueError(f"checkpoint {path} holds models {meta.get('parts')}, not {sorted(parts)}")
    for sub, p in parts.items():
        d, model = path / sub, p["model"]
        opt_state = None
        if p.get("optimizer") is not None:
            if not (d / "optimizer.json").exists():
                raise ValueError(f"checkpoint {d} holds no optimizer state")
            opt_state = _unflatten_optimizer(load_file(str(d / "optimizer.safetensors")),
                                             json.loads((d / "optimizer.json").read_text()), p["optimizer"])
        missing, unexpected = load_full_state_dict(model, load_file(str(d / "model.safetensors")),
                                                   p.get("optimizer"), opt_state)
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        tied |= {k for k in missing if k.endswith("lm_head.weight")
                 and getattr(getattr(model, "config", None), "tie_word_embeddings", False)}
        if unexpected or set(missing) - tied:
            raise ValueError(f"checkpoint {d} does not fit the model: missing {sorted(set(missing) - tied)}, "
                             f"unexpected {sorted(unexpected)}")
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        if p.get("reference") is not None and (d / "reference.safetensors").exists():
            load_full_state_dict(p["reference"], load_file(str(d / "reference.safetensors")))
            if hasattr(p["reference"], "tie_weights"):
                p["reference"].tie_weights()
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


def _flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
    """An optimizer state dict (keyed by parameter index) as tensors and JSON."""
    import torch

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
