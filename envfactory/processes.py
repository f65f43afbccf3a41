"""Worker processes that end with the process that started them.

A ``ProcessPoolExecutor``'s workers outlive a parent that is killed (``SIGKILL``, the OOM
killer, a crashed interpreter): no ``finally`` or ``atexit`` runs in the parent, and a worker
goes on with its job (minutes of CPU for a training unit) or waits on its queue for good.
:func:`worker_pool` starts workers whose kernel ends them when their parent dies (Linux's
``PR_SET_PDEATHSIG``; elsewhere a worker still ends when its pool is shut down).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor

__all__ = ["die_with_parent", "worker_pool"]


def die_with_parent(parent: int) -> None:
    """A worker process's initializer: the kernel kills this process when its parent dies. If
    ``parent`` (the pool's process) is already gone, the worker ends at once."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def worker_pool(workers: int, method: str = "spawn") -> ProcessPoolExecutor:
    """A process pool of ``workers`` started by ``method`` (``"spawn"`` or ``"fork"``; a
    ``"forkserver"`` worker's parent is the fork server, not this process) whose workers die
    with this process (see the module docstring).

    The kernel's "parent" is the *thread* that started a worker, and the pool starts workers in
    the thread that submits: submit from one thread that outlives the pool's work (a ``with``
    block around it, as every caller here does), not from short-lived threads."""
    import multiprocessing as mp

    if method not in ("spawn", "fork"):
        raise ValueError(f"method must be 'spawn' or 'fork', got {method!r}")
    return ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=die_with_parent,
                               initargs=(os.getpid(),))
