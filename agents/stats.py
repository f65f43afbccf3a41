"""Statistics for training claims: paired differences with bootstrap confidence intervals.

A claim that one arm (say RL) beats another (SFT alone) is made on evaluation
tasks, paired by seed (both arms start from the same checkpoint of a seed) and
by task (both are evaluated on the same tasks). :func:`paired_bootstrap` takes
each arm's success per (seed, task) and resamples seeds and tasks independently
(a two-way bootstrap: both are samples from larger populations, and successes
cluster by seed and by task), so the interval reflects both sources of spread.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["paired_bootstrap", "bootstrap_mean", "holm"]


def _grid(x: Sequence[Sequence[float]], name: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty seeds x tasks grid, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite values")
    return a


def bootstrap_mean(x: Sequence[Sequence[float]], *, resamples: int = 10_000, level: float = 0.95,
                   seed: int = 0) -> dict[str, Any]:
    """Mean of a seeds x tasks grid with a two-way bootstrap interval (rows and columns
    resampled independently, with replacement)."""
    d = _grid(x, "x")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    n_s, n_t = d.shape
    rows = rng.integers(0, n_s, size=(resamples, n_s))
    cols = rng.integers(0, n_t, size=(resamples, n_t))
    # mean over the resampled grid = mean over resampled rows of (row-sums over resampled columns)
    col_counts = np.zeros((resamples, n_t))
    np.add.at(col_counts, (np.arange(resamples)[:, None], cols), 1.0)
    row_means = d @ col_counts.T / n_t          # [n_s, resamples]: each seed's mean over the resampled tasks
    stats = np.take_along_axis(row_means.T, rows, axis=1).mean(axis=1)
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    # two-sided bootstrap p-value of "mean = 0": twice the smaller tail beyond 0 (at least 1 / resamples)
    p = min(1.0, max(2 * min(float((stats <= 0).mean()), float((stats >= 0).mean())), 1 / resamples))
    return {"mean": float(d.mean()), "ci": [float(lo), float(hi)], "level": level, "seeds": n_s, "tasks": n_t,
            "resamples": resamples, "p": p}


def paired_bootstrap(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, resamples: int = 10_000,
                     level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """``b − a`` paired by seed and task: the mean difference, its two-way bootstrap interval,
    and whether that interval excludes 0.

    Args:
        a, b: Each arm's success (a rate or 0/1) per ``[seed][task]``, same seeds and tasks in the same order.
    """
    x, y = _grid(a, "a"), _grid(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"the arms are not paired: shapes {x.shape} and {y.shape}")
    out = bootstrap_mean(y - x, resamples=resamples, level=level, seed=seed)
    out["excludes_zero"] = bool(out["ci"][0] > 0 or out["ci"][1] < 0)
    return out


def holm(p_values: dict[str, float], alpha: float = 0.05) -> dict[str, dict[str, Any]]:
    """Holm-Bonferroni over a family of comparisons: per name, the adjusted p-value and whether
    the comparison is significant at family-wise error ``alpha``."""
    order = sorted(p_values, key=lambda k: p_values[k])
    m, running, out = len(order), 0.0, {}
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * p_values[k]))
        out[k] = {"p": p_values[k], "p_holm": running, "significant": running < alpha}
    return out
