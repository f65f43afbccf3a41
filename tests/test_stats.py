"""Paired two-way bootstrap for training claims (agents.stats)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.stats import bootstrap_mean, paired_bootstrap


def test_vectorised_bootstrap_equals_the_plain_loop() -> None:
    rng = np.random.default_rng(3)
    d = rng.random((5, 12))
    got = bootstrap_mean(d, resamples=500, seed=7)
    draw = np.random.default_rng(7)
    rows = draw.integers(0, 5, size=(500, 5))
    cols = draw.integers(0, 12, size=(500, 12))
    stats = [d[np.ix_(r, c)].mean() for r, c in zip(rows, cols)]
    assert got["ci"] == pytest.approx(list(np.quantile(stats, [0.025, 0.975])))
    assert got["mean"] == pytest.approx(d.mean())


def test_a_constant_difference_has_a_zero_width_interval() -> None:
    a = np.zeros((5, 12))
    out = paired_bootstrap(a, a + 0.25)
    assert out["mean"] == pytest.approx(0.25) and out["ci"] == pytest.approx([0.25, 0.25])
    assert out["excludes_zero"]


def test_noise_around_zero_is_not_a_difference_and_a_clear_gain_is() -> None:
    rng = np.random.default_rng(0)
    a = rng.random((5, 16))
    assert not paired_bootstrap(a, a + rng.normal(0, 0.2, a.shape))["excludes_zero"]
    assert paired_bootstrap(a, a + 0.3 + rng.normal(0, 0.05, a.shape))["excludes_zero"]


def test_one_bad_seed_widens_the_interval() -> None:
    # successes that cluster on one seed are one unit of evidence, not many
    a = np.zeros((5, 12))
    b = a.copy()
    b[0] = 1.0
    out = paired_bootstrap(a, b)
    assert out["mean"] == pytest.approx(0.2) and out["ci"][0] == 0.0


def test_unpaired_or_empty_arms_are_errors() -> None:
    with pytest.raises(ValueError, match="not paired"):
        paired_bootstrap(np.zeros((5, 12)), np.zeros((4, 12)))
    with pytest.raises(ValueError, match="grid"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_mean([[0.0, float("nan")]])
