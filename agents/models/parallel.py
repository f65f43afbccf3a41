"""Training across processes under ``torchrun``: plain data parallel and FSDP2 (gloo on CPUs, NCCL on GPUs).

Every rank samples its own tasks and seeds, plays its own groups (ARPO's forked branches stay within a
rank) and trains on its own samples. One step equals the single-process step on the union of the ranks'
batches: the token-mean divides by the token counts summed over the ranks (:meth:`World.sum`), and the
gradients are summed over the ranks before clipping:

* ``dp``: every rank holds the whole model; one all-reduce of the gradients after its micro-batches
  (:func:`sum_gradients`), so ranks may run different numbers of micro-batches.
* ``fsdp2``: PyTorch's ``fully_shard`` on each decoder layer and on the root; parameters, gradients and
  AdamW's state are sharded. The gradients are reduce-scattered in each backward pass, so every rank runs
  the same number of micro-batches (:meth:`World.max`; a rank with fewer runs empty ones). Sampling runs on
  gathered parameters (:func:`gathered`: unsharded once, no collective per decode step) under
  ``torch.no_grad``; checkpoints hold full state dicts, so a run resumes on another world size.

Nothing here is home-made distribution: ``torch.distributed`` and ``torch.distributed.fsdp.fully_shard``
do the work; this module only decides when.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Literal

__all__ = ["World", "world", "shard", "loss_scale", "is_sharded", "gathered", "sum_gradients", "full_state_dict",
           "load_full_state_dict", "rank", "barrier", "PARALLEL_MODES"]

PARALLEL_MODES = ("auto", "none", "dp", "fsdp2")
Mode = Literal["none", "dp", "fsdp2"]


@dataclass(frozen=True)
class World:
    """This process's place among the training processes.

    Attributes:
        rank: This process's rank (0 alone).
        size: How many processes train together (1 alone).
        mode: ``none`` (one process), ``dp`` or ``fsdp2``.
    """

    rank: int = 0
    size: int = 1
    mode: Mode = "none"

    @property
    def main(self) -> bool:
        """Whether this process writes logs and checkpoints (rank 0)."""
        return self.rank == 0

    def sum(self, x: float) -> float:
        """``x`` summed over the ranks."""
        return self._reduce([x], "sum")[0]

    def sums(self, *xs: float) -> list[float]:
        """Each of ``xs`` summed over the ranks, in one all-reduce."""
        return self._reduce(list(xs), "sum")

    def max(self, x: float) -> float:
        """The largest ``x`` of the ranks."""
        return self._reduce([x], "max")[0]

    def _reduce(self, xs: list[float], op: str) -> list[float]:
        if self.size == 1:
            return [float(x) for x in xs]
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(x) for x in xs], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.tolist()


def world(mode: str = "auto") -> World:
    """The training processes this one belongs to, starting the process group when ``torchrun`` launched
    several (``WORLD_SIZE`` > 1) and none is started yet: gloo on CPUs, NCCL when CUDA is there.

    Args:
        mode: ``auto`` (``dp`` under ``torchrun`` with several processes, else ``none``), ``none``, ``dp``
            or ``fsdp2``.

    Raises:
        ValueError: an unknown mode, or ``dp``/``fsdp2`` asked for in a single process that ``torchrun`` did not
            launch (the error says how to launch it).
    """
    if mode not in PARALLEL_MODES:
        raise ValueError(f"parallel must be one of {list(PARALLEL_MODES)}, not {mode!r}")
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if mode == "none" or (mode == "auto" and size == 1):
        return World()
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise ValueError(f"parallel={mode!r} needs several processes: launch with "
                             "`torchrun --nproc-per-node N your_script.py` (or set parallel: none)")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return World(dist.get_rank(), dist.get_world_size(), "dp" if mode == "auto" else mode)  # type: ignore[arg-type]


def _comm_device() -> Any:
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _layers(model: Any) -> list[Any]:
    """The decoder layers of a transformers causal LM (``model.model.layers`` and the like)."""
    for path in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return list(obj)
    base = getattr(model, "get_base_model", None)  # a peft model: its wrapped model's layers
    return _layers(base()) if callable(base) and base() is not model else []


def shard(model: Any, w: World) -> Any:
    """``fully_shard`` each decoder layer of ``model`` and then the root (FSDP2), in place; ``model``
    unchanged unless ``w.mode`` is ``fsdp2``. FSDP2 averages the gradients over the ranks (gloo has no
    pre-scaled sum), so the loss it backpropagates is scaled by the world size (:func:`loss_scale`): the
    loss already divides by the global token count."""
    if w.mode != "fsdp2":
        return model
    from torch.distributed.fsdp import fully_shard

    for layer in _layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def loss_scale(w: World) -> float:
    """What the loss is multiplied by before backward so that the ranks' gradients add up (FSDP2 divides
    their sum by the world size; plain data parallel sums them in :func:`sum_gradients`)."""
    return float(w.size) if w.mode == "fsdp2" else 1.0


def _fsdp_modules(model: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: Any) -> bool:
    """Whether ``fully_shard`` sharded ``model`` (or a part of it)."""
    return bool(_fsdp_modules(model))


@contextlib.contextmanager
def gathered(model: Any) -> Iterator[None]:
    """Parameters of an FSDP2 ``model`` gathered for the length of the block (sampling: no collective per
    forward pass, so ranks may decode different numbers of steps); a plain module as it is."""
    mods = _fsdp_modules(model)
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def sum_gradients(params: list[Any], w: World) -> None:
    """Plain data parallel: sum every parameter's gradient over the ranks (one flat all-reduce); a missing
    gradient counts as zeros. Nothing to do alone or under FSDP2 (its backward reduce-scatters)."""
    if w.mode != "dp" or w.size == 1:
        return
    import torch
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    i = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[i:i + n].view_as(p.grad))
        i += n


def full_state_dict(model: Any, optimizer: Any = None, *,
                    everywhere: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The whole model's state dict (and the optimizer's, keyed by index as ``optimizer.state_dict()`` is),
    whatever the sharding: what a checkpoint holds, so it resumes on any world size. Under FSDP2 every rank
    must call it (it gathers) and the full state lands on rank 0 (in CPU memory) and the others get empty
    dicts, unless ``everywhere`` (every rank gets it, where it was)."""
    if not is_sharded(model):
        return model.state_dict(), (optimizer.state_dict() if optimizer is not None else None)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    if optimizer is None:
        return get_model_state_dict(model, options=opts), None
    state, optim = get_state_dict(model, optimizer, options=opts)
    if "state" not in optim:  # with cpu_offload the full state lands on rank 0 only
        return state, None
    index = {name: i for i, name in enumerate(_trainable_names(model))}
    return state, {"state": {index[k]: v for k, v in optim["state"].items()},
                   "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in optim["param_groups"]]}


def load_full_state_dict(model: Any, state: dict[str, Any], optimizer: Any = None,
                         optimizer_state: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """Load a full state dict (and an optimizer state keyed by index) into ``model``, sharded or not;
    return the missing and unexpected keys (FSDP2: none reported)."""
    if not is_sharded(model):
        missing, unexpected = model.load_state_dict(state, strict=False)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        return list(missing), list(unexpected)
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, state, options=opts)
    if optimizer is not None and optimizer_state is not None:
        names = _trainable_names(model)
        by_name = {"state": {names[int(i)]: v for i, v in optimizer_state["state"].items()},
                   "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                                    for g in optimizer_state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=opts)
    return [], []


def _trainable_names(model: Any) -> list[str]:
    """The names of the parameters the optimizer holds, in its order (it is built over the trainable
    parameters in ``named_parameters`` order)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def rank() -> int:
    """This process's rank in the started process group (0 when none is started)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    """Wait for every rank (nothing alone)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
