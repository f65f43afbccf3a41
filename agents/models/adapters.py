"""What a learner trains: every weight in float32, or LoRA adapters (``peft``) over a frozen base.

AdamW over bfloat16 weights trains almost nothing and says nothing: an update smaller than a weight's
rounding step (about 1/256 of it) is lost, so ten AdamW steps at ARPO's learning rate (1e-6) moved 1.9% of
a bfloat16 model's weights (float32: 99.99%). :func:`check_trainable` therefore refuses trainable weights
that are not float32, by name, with the fix: load the model in float32 and let ``learner.autocast: bf16``
run the forward passes in bfloat16 (the float32 weights are then the master copy AdamW updates), or train
LoRA adapters, which :func:`add_lora` keeps in float32 over a base that may stay bfloat16.

With LoRA the KL reference is the base itself with the adapters off (:func:`adapters_off`): no copy of
the model is made. The adapters are injected into the model in place, so a policy that shares the model
(:class:`~agents.policies.hf_policy.HFPolicy`) samples with them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

__all__ = ["add_lora", "adapters_off", "check_trainable", "trainable_parameters", "has_lora"]

PEFT_HINT = "pip install 'envfactory[train]' (it brings peft)"


def trainable_parameters(model: Any) -> list[Any]:
    """The parameters AdamW updates: those that require a gradient."""
    return [p for p in model.parameters() if p.requires_grad]


def check_trainable(model: Any) -> None:
    """Refuse, by name, trainable weights that are not float32 (see the module docstring).

    Raises:
        TypeError: some trainable weight is bfloat16 or float16 (the message names how many, the
            dtype, and the two ways out); no trainable weight at all.
    """
    import torch

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise TypeError("the model has no trainable weight (every parameter has requires_grad=False)")
    low = [(n, p) for n, p in params if p.is_floating_point() and p.dtype != torch.float32]
    if low:
        n, p = low[0]
        raise TypeError(
            f"{len(low)} of {len(params)} trainable weights are {str(p.dtype).removeprefix('torch.')} "
            f"(e.g. {n}): AdamW on them loses every update smaller than their rounding step, so the model "
            "barely trains and nothing says so. Load the model in float32 (HFPolicy(path, dtype=torch.float32), "
            "or AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)) and set learner.autocast: bf16 "
            "to run the forward passes in bfloat16, or train LoRA adapters (learner.lora), which stay float32 "
            "over a bfloat16 base")


def add_lora(model: Any, cfg: Any) -> Any:
    """Inject LoRA adapters into ``model`` in place (``peft``), as ``cfg`` (a
    :class:`~agents.train_config.LoRAConfig`) says: the base frozen, the adapters float32 and trainable. Returns the ``peft`` model (what :func:`adapters_off` needs); ``model`` itself now runs with
    the adapters.

    Raises:
        ImportError: ``peft`` is missing (the message says how to install it).
    """
    import torch

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError(f"learner.lora needs peft: {PEFT_HINT}") from exc
    config = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                        target_modules=cfg.target_modules or "all-linear", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()  # adapters over a bfloat16 base start in its dtype: train them in float32
    # the handle adapters_off needs, kept out of the module tree (as a submodule it would enter state_dict)
    object.__setattr__(model, "_envfactory_peft", peft_model)
    return peft_model


def has_lora(model: Any) -> bool:
    """Whether :func:`add_lora` put adapters into ``model``."""
    return getattr(model, "_envfactory_peft", None) is not None


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """``model`` runs as its base, adapters off, for the length of the block (the KL reference)."""
    peft_model = getattr(model, "_envfactory_peft", None)
    if peft_model is None:
        raise ValueError("the model has no LoRA adapters (add_lora)")
    with peft_model.disable_adapter():
        yield
