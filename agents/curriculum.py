"""A difficulty curriculum over environment families' endless task supplies.

``Trainer(..., curriculum=Curriculum(start=1, promote_at=0.6))`` draws each step's tasks
from :func:`envfactory.task_supply` of the trainer's environments at the current difficulty
(1-5: bigger tables, more rows per goal, longer walks) instead of a fixed pool, and raises the
difficulty once the training success rate has reached ``promote_at`` for ``patience`` steps
in a row. Supplied tasks are freshly sampled worlds, never the registered (and so never the
evaluation-split) tasks, and every draw is seeded: a resumed run draws what the original
would have (the curriculum's state is part of the checkpoint).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Sequence

__all__ = ["Curriculum"]


class Curriculum:
    """Tasks by difficulty, promoted on success.

    Args:
        start: The first difficulty (1-5).
        top: The hardest difficulty it promotes to.
        promote_at: The training success rate that counts as mastered.
        patience: How many steps in a row must reach it.
        kinds: Only these task kinds (default: every kind each family makes).
        seed: Which task streams.
    """

    def __init__(self, *, start: int = 1, top: int = 5, promote_at: float = 0.6, patience: int = 2,
                 kinds: Sequence[str] | None = None, seed: int = 0) -> None:
        if not 1 <= start <= top <= 5:
            raise ValueError(f"difficulties run 1 <= start <= top <= 5; got start={start}, top={top}")
        if not 0.0 < promote_at <= 1.0 or patience < 1:
            raise ValueError("promote_at must be in (0, 1] and patience at least 1")
        self.level, self.top, self.promote_at, self.patience = start, top, promote_at, patience
        self.kinds, self.seed = list(kinds) if kinds else None, seed
        self.recent: list[float] = []
        self.drawn: dict[str, int] = {}   # "<env>/<level>" -> tasks taken from that stream
        self._streams: dict[str, Iterator[Any]] = {}
        self._envs: list[Any] = []

    def bind(self, envs: Sequence[Any]) -> None:
        """Use these episodes (the trainer's); each must have a task supply."""
        import envfactory

        for e in envs:
            envfactory.task_supply(e.spec.name, self.level, self.seed, self.kinds)  # raises if it has none
        self._envs = list(envs)

    def _stream(self, env: Any) -> Iterator[Any]:
        import envfactory

        key = f"{env.spec.name}/{self.level}"
        if key not in self._streams:
            s = envfactory.task_supply(env.spec.name, self.level, self.seed, self.kinds)
            self._streams[key] = itertools.islice(s, self.drawn.get(key, 0), None)  # resume where it was
        return self._streams[key]

    def draw(self, n: int) -> list[tuple[Any, Any]]:
        """The next ``n`` ``(episode, task)`` pairs at the current difficulty, round-robin over the
        environments."""
        if not self._envs:
            raise RuntimeError("the curriculum is not bound to environments (Trainer(curriculum=...) binds it)")
        out = []
        for i in range(n):
            env = self._envs[(sum(self.drawn.values()) + i) % len(self._envs)]
            out.append((env, next(self._stream(env))))
        for env, _ in out:
            key = f"{env.spec.name}/{self.level}"
            self.drawn[key] = self.drawn.get(key, 0) + 1
        return out

    def observe(self, success: float) -> bool:
        """Record one step's training success; promote (and return ``True``) once it has reached
        ``promote_at`` for ``patience`` steps in a row."""
        self.recent = (self.recent + [float(success)])[-self.patience:]
        if self.level < self.top and len(self.recent) == self.patience and min(self.recent) >= self.promote_at:
            self.level += 1
            self.recent = []
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "recent": list(self.recent), "drawn": dict(self.drawn)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level, self.recent, self.drawn = int(state["level"]), list(state["recent"]), dict(state["drawn"])
        self._streams = {}
