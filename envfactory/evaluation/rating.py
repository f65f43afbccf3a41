"""Elo-scale ratings with uncertainty from seat-rotated matches between policies (competitive games).

A match is one episode of a competitive team environment in which policy ``a``
plays one seat and policy ``b`` the others; ``a`` scores 1 if its payoff is
higher than the mean payoff of the other seats, 0.5 on equal payoffs, 0 if lower
(:func:`match_score`). The team evaluation (:mod:`envfactory.evaluation.eval`) gets
its matches from the cross-play episodes, where each pair of policies plays
every task with each policy in every seat (seat rotation), so that a first-mover
advantage cancels out.

:func:`rate` fits a Bradley-Terry model (the Elo model: ``P(a beats b) =
1 / (1 + 10 ** ((R_b - R_a) / 400))``, a draw counting half a win each) by
maximum a posteriori estimation under a Gaussian prior on every rating (mean
1500, standard deviation ``prior_sd``, 350 by default): TrueSkill-style, the
prior keeps ratings finite when one policy wins every match, and the
uncertainty of each rating is the standard deviation of the Laplace
approximation of the posterior (the inverse of the negative Hessian at the
optimum), relative to the mean rating of the field (which the prior fixes at 1500:
only differences are identified by the matches). The fit is deterministic and does not depend on the order of the
matches (unlike incremental Elo updates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["Match", "match_score", "rate", "expected_score", "ELO_SCALE", "BASE_RATING"]

ELO_SCALE = 400 / math.log(10)  # Elo points per unit of log-odds
BASE_RATING = 1500.0


@dataclass(frozen=True)
class Match:
    """One match: ``a`` against ``b``; ``score`` is a's (1 win, 0.5 draw, 0 loss)."""

    a: str
    b: str
    score: float


def match_score(mine: float, theirs: float, tol: float = 1e-9) -> float:
    """1 if ``mine`` beats ``theirs``, 0.5 if they are equal (within ``tol``), else 0."""
    if mine > theirs + tol:
        return 1.0
    if theirs > mine + tol:
        return 0.0
    return 0.5


def expected_score(ra: float, rb: float) -> float:
    """The Elo model's expected score of a player rated ``ra`` against one rated ``rb``."""
    return 1.0 / (1.0 + 10 ** ((rb - ra) / 400))


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """``m x = v`` by Gauss-Jordan elimination with partial pivoting (small dense systems)."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[piv] = a[piv], a[col]
        p = a[col][col]
        for r in range(n):
            if r != col and a[r][col]:
                f = a[r][col] / p
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def _inverse(m: list[list[float]]) -> list[list[float]]:
    n = len(m)
    cols = [_solve(m, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    return [[cols[j][i] for j in range(n)] for i in range(n)]


def rate(matches: Iterable[Match], players: Sequence[str] = (), *, prior_sd: float = 350.0,
         base: float = BASE_RATING) -> dict[str, dict[str, Any]]:
    """Ratings of ``players`` (default: everyone in ``matches``) from ``matches``.

    Returns ``{player: {"rating", "sd", "ci95", "matches", "wins", "draws", "losses", "score"}}``
    (ratings and their standard deviations in Elo points, rounded to 0.1; ``score`` is the mean
    match score), ordered from the highest rating down."""
    matches = list(matches)
    names = list(dict.fromkeys([*players, *(p for m in matches for p in (m.a, m.b))]))
    idx = {p: i for i, p in enumerate(names)}
    n = len(names)
    if n == 0:
        return {}
    prec = (ELO_SCALE / prior_sd) ** 2  # prior precision in log-odds units
    r = [0.0] * n
    hess: list[list[float]] = []
    for _ in range(100):
        grad = [-prec * x for x in r]
        hess = [[prec if i == j else 0.0 for j in range(n)] for i in range(n)]  # the negative Hessian
        for m in matches:
            i, j = idx[m.a], idx[m.b]
            if i == j:
                continue
            p = 1.0 / (1.0 + math.exp(r[j] - r[i]))
            grad[i] += m.score - p
            grad[j] -= m.score - p
            w = p * (1.0 - p)
            hess[i][i] += w
            hess[j][j] += w
            hess[i][j] -= w
            hess[j][i] -= w
        step = _solve(hess, grad)
        r = [x + d for x, d in zip(r, step)]
        if max(abs(d) for d in step) < 1e-10:
            break
    # The likelihood only sees rating differences; the prior centres the ratings on the base (at
    # the optimum they sum to zero). Uncertainty is reported relative to that centre: the covariance
    # of r - mean(r), without the unidentifiable shift of the whole field.
    full = _inverse(hess)
    row_mean = [sum(row) / n for row in full]
    grand = sum(row_mean) / n
    cov = [[full[i][j] - row_mean[i] - row_mean[j] + grand for j in range(n)] for i in range(n)]
    out: dict[str, dict[str, Any]] = {}
    for who in sorted(names, key=lambda name: -r[idx[name]]):
        i = idx[who]
        rating, sd = base + ELO_SCALE * r[i], ELO_SCALE * math.sqrt(max(cov[i][i], 0.0))
        mine = [m.score if m.a == who else 1.0 - m.score for m in matches if who in (m.a, m.b) and m.a != m.b]
        out[who] = {"rating": round(rating, 1), "sd": round(sd, 1),
                  "ci95": [round(rating - 1.96 * sd, 1), round(rating + 1.96 * sd, 1)],
                  "matches": len(mine), "wins": sum(s == 1.0 for s in mine), "draws": sum(s == 0.5 for s in mine),
                  "losses": sum(s == 0.0 for s in mine),
                  "score": round(sum(mine) / len(mine), 4) if mine else None}
    return out


def matches_from_rows(rows: Iterable[Mapping[str, Any]], a: str, b: str, seat: str) -> list[Match]:
    """Matches from episode rows (:func:`envfactory.evaluation.eval.episode_row`) in which policy ``a``
    played ``seat`` and ``b`` every other seat; episodes that raised are left out."""
    out = []
    for row in rows:
        rewards = row.get("rewards") or {}
        if row.get("error") or seat not in rewards or len(rewards) < 2:
            continue
        others = [v for k, v in rewards.items() if k != seat]
        out.append(Match(a, b, match_score(rewards[seat], sum(others) / len(others))))
    return out


def head_to_head(matches: Iterable[Match]) -> dict[str, dict[str, dict[str, int]]]:
    """``{a: {b: {"wins", "draws", "losses"}}}`` from a's side, for each pair as it was played
    (JSON data; :func:`matches_from_head_to_head` gives the matches back, which is all :func:`rate` needs)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for m in matches:
        cell = out.setdefault(m.a, {}).setdefault(m.b, {"wins": 0, "draws": 0, "losses": 0})
        cell["wins" if m.score == 1.0 else "draws" if m.score == 0.5 else "losses"] += 1
    return out


def matches_from_head_to_head(h2h: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[Match]:
    """The matches a :func:`head_to_head` table counts."""
    out = []
    for a, row in h2h.items():
        for b, c in row.items():
            out += [Match(a, b, 1.0)] * c["wins"] + [Match(a, b, 0.5)] * c["draws"] + [Match(a, b, 0.0)] * c["losses"]
    return out
