"""agents.policies.decode.prefix_cache.PrefixCache: the sorted index finds what a scan of every entry finds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.policies.decode.prefix_cache import PrefixCache, common_prefix_len

# short sequences over a few ids (and a large one: byte order must be id order), so that prefixes collide
seqs = st.lists(st.sampled_from([0, 1, 2, 255, 256, 70_000]), min_size=1, max_size=7)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), seqs), min_size=1, max_size=40), st.integers(4, 40))
def test_lookup_and_add_agree_with_a_scan_of_every_entry(ops, max_tokens) -> None:
    cache = PrefixCache(max_tokens)
    for is_add, ids in ops:
        a = np.asarray(ids, dtype=np.int64)
        if is_add:
            cache.add(a, [])
        else:
            entry, n = cache.lookup(a)
            best = max((common_prefix_len(e.ids, a) for e in cache._entries), default=0)
            assert n == best
            assert (entry is None) == (best == 0)
            if entry is not None:
                assert common_prefix_len(entry.ids, a) == n
        kept = [e.ids.tolist() for e in cache._entries]
        assert kept == sorted(kept)  # the index's order
        assert cache.tokens == sum(len(e.ids) for e in cache._entries) <= max_tokens
        for x in kept:  # no entry is a prefix of another: the longer covers it
            assert not any(y != x and y[:len(x)] == x for y in kept)


def test_a_newer_sequence_covers_its_prefixes_and_the_least_recently_used_goes_first() -> None:
    cache = PrefixCache(10)
    cache.add(np.array([1, 2]), [])
    cache.add(np.array([5, 6, 7]), [])
    cache.add(np.array([1, 2, 3]), [])  # covers [1, 2]
    assert [e.ids.tolist() for e in cache._entries] == [[1, 2, 3], [5, 6, 7]]
    cache.add(np.array([1]), [])  # already covered: nothing added
    assert cache.tokens == 6
    assert cache.lookup(np.array([5, 6, 9]))[1] == 2  # [5, 6, 7] is now the most recently used
    cache.add(np.array([8, 8, 8, 8, 8]), [])  # 11 tokens: [1, 2, 3] is the least recently used
    assert [e.ids.tolist() for e in cache._entries] == [[5, 6, 7], [8, 8, 8, 8, 8]]
