"""A prefix KV cache for :class:`~agents.hf_policy.HFPolicy`.

Multi-turn rollouts resend the whole conversation every turn, and ARPO branches
share their parent's prefix. The cache keeps the keys/values of recently
computed sequences; a new prompt reuses those of its longest common prefix with
any kept sequence and only the rest is run through the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["PrefixCache", "CacheEntry"]

KV = list[tuple["torch.Tensor", "torch.Tensor"]]  # per layer: keys, values, each [kv_heads, seq, head_dim]


@dataclass
class CacheEntry:
    ids: np.ndarray  # int64 token ids whose keys/values ``kv`` holds, in order
    kv: KV
    last_used: int


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixCache:
    """Keeps the KV of up to ``max_tokens`` tokens (least recently used go first).

    Entries are whole sequences; a lookup may use any prefix of one. An entry that
    is a prefix of a newly added sequence is dropped (the new one covers it).
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max(0, int(max_tokens))
        self._entries: list[CacheEntry] = []
        self._clock = 0

    @property
    def tokens(self) -> int:
        return sum(len(e.ids) for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def lookup(self, ids: np.ndarray) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest prefix with ``ids``, and that length."""
        best, best_len = None, 0
        for e in self._entries:
            n = common_prefix_len(e.ids, ids)
            if n > best_len:
                best, best_len = e, n
        if best is not None:
            self._clock += 1
            best.last_used = self._clock
        return best, best_len

    def add(self, ids: np.ndarray, kv: KV) -> None:
        """Keep ``kv`` (the keys/values of exactly ``ids``)."""
        if self.max_tokens == 0 or len(ids) == 0 or len(ids) > self.max_tokens:
            return
        kept = []
        for e in self._entries:
            n = common_prefix_len(e.ids, ids)
            if n == len(ids):  # already covered by a longer (or equal) entry
                self._clock += 1
                e.last_used = self._clock
                return
            if n < len(e.ids):
                kept.append(e)
        self._clock += 1
        kept.append(CacheEntry(ids, kv, self._clock))
        self._entries = kept
        total = self.tokens
        if total > self.max_tokens:
            self._entries.sort(key=lambda e: e.last_used)
            while total > self.max_tokens:
                total -= len(self._entries.pop(0).ids)
