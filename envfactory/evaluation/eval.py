"""Evaluation of policies, one agent or a team: episode rows, success with 95% Wilson intervals,
coordination metrics, contributions and cross-play.

Every scripted episode is played by :func:`~envfactory.checks.scripted.play` and described by
:func:`episode_row`; :func:`summarize` makes rows into success with its interval (:func:`wilson`)
and per-episode means, for ``envfactory eval`` (:func:`agents.eval.evaluate`, which adds batched
model rollouts) and for :func:`evaluate`, the team evaluation (``envfactory eval-team``, or
``envfactory eval`` on team environments). For each environment and each policy (playing every
role: a homogeneous team):

* **joint success** with a 95% Wilson confidence interval, per mode (AEC turn
  order and Parallel simultaneous moves);
* **rounds to success** (mean over successful episodes);
* **messages per success** (all letters sent / successes) and per episode;
* **redundant** actions (a successful call repeating an earlier one, by anyone),
  **conflicting** actions (calls refused because of another agent's action)
  and **permission** errors (calls of another role's tools), per episode;
* per-agent mean reward (the payoff, in mixed-motive games);
* each agent's **contribution**: team success minus the success of the same
  team with that agent replaced by a no-op (AEC);
* a **cross-play matrix** across policies: cell (row, col) is the success
  when one role plays ``row`` and every other role ``col``, averaged over
  which role plays ``row`` (AEC); the diagonal is the homogeneous team;
* for **competitive games** (``spec.metadata["competitive"]``), an Elo-scale
  **rating** of every policy with its uncertainty (:mod:`envfactory.evaluation.rating`),
  from the cross-play episodes: each pair of policies plays every task with each
  policy in every seat (seat rotation), the one with the higher payoff winning the
  match; per environment, and pooled over the competitive environments.

Deterministic policies play each task once; stochastic ones (random, models)
``episodes`` times with different seeds. Model policies play at most
``model_tasks`` tasks per environment (a CPU budget); the document says so.

Policies are named: the scripted ones (:mod:`envfactory.checks.scripted`:
``oracle``, ``random``, ``noop``, ``claim``), ``expert`` (each environment's strong
scripted policy, ``spec.metadata["expert"]``, e.g. a game's strong player; the oracle
where an environment has none: :class:`ExpertPolicy`), ``env:<key>`` (an environment's
own policy ``spec.metadata["policies"][key]``, e.g. ``env:naive``, a game's weak
baseline; a no-op elsewhere) and whatever installed packages
announce in the entry-point group ``envfactory.policies`` (:data:`POLICY_GROUP`):
a name ``kind`` or ``kind:argument`` loads the entry point ``kind`` and calls it
as ``factory(argument or None, name=name, max_new_tokens=n)``; it returns a
policy (``name``, ``act(episode, agent, seed)``, optionally ``stochastic``).
The ``agents`` package announces ``tiny`` (the embedded tiny model) and ``hf``
(``hf:<path or hub id>``) this way, so ``envfactory`` never imports it. Callers
may also pass policy objects (or :class:`PolicyEntry` objects) directly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..checks.scripted import MODES, SCRIPTED, NoopPolicy, OraclePolicy, Outcome, RolePolicy, play, scripted_policy
from ..definition import ToolEnvSpec
from ..episode import Episode
from .rating import head_to_head, matches_from_head_to_head, matches_from_rows, rate

__all__ = ["PolicyEntry", "POLICY_GROUP", "build_policies", "policy_factories", "wilson", "episode_row",
           "summarize", "evaluate_env", "evaluate", "team_names", "run_and_report", "ExpertPolicy", "competitive"]

POLICY_GROUP = "envfactory.policies"


@dataclass
class PolicyEntry:
    """A policy under evaluation: its name, the policy, and how much to play it."""

    name: str
    policy: RolePolicy
    stochastic: bool
    max_tasks: int | None = None


class ExpertPolicy:
    """Each environment's own scripted policy ``key``: ``spec.metadata["expert"]`` for ``expert``,
    ``spec.metadata["policies"][key]`` otherwise (classes, instantiated once per environment). Where
    an environment has none, the expert is the oracle
    (:class:`~envfactory.checks.scripted.OraclePolicy`) and any other key a no-op."""

    stochastic = False

    def __init__(self, key: str = "expert") -> None:
        self.key = key
        self.name = key if key == "expert" else f"env:{key}"
        self._by_env: dict[str, RolePolicy] = {}

    def act(self, episode: Episode, agent: str, seed: int) -> Any:
        spec = episode.spec
        pol = self._by_env.get(spec.name)
        if pol is None:
            meta = spec.metadata
            factory = meta.get("expert") if self.key == "expert" else (meta.get("policies") or {}).get(self.key)
            if factory is not None:
                pol = factory()
            else:
                pol = OraclePolicy() if self.key == "expert" else NoopPolicy()
            self._by_env[spec.name] = pol
        return pol.act(episode, agent, seed)


def competitive(spec: ToolEnvSpec) -> bool:
    """Whether ``spec`` is a competitive game (its policies get a rating): ``metadata["competitive"]``."""
    return bool(spec.metadata.get("competitive")) and spec.payoff is not None


def policy_factories() -> dict[str, Any]:
    """The policy kinds installed packages announce in :data:`POLICY_GROUP` (entry points, not loaded)."""
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=POLICY_GROUP)}


def build_policies(policies: Sequence[Any], *, model_tasks: int = 2, max_new_tokens: int = 48
                   ) -> list[PolicyEntry]:
    """Policies by name (see the module docstring), or given as policy or :class:`PolicyEntry` objects.

    Model policies (from :data:`POLICY_GROUP`) play at most ``model_tasks`` tasks per environment."""
    out = []
    for p in policies:
        if isinstance(p, PolicyEntry):
            out.append(p)
        elif not isinstance(p, str):
            out.append(PolicyEntry(getattr(p, "name", type(p).__name__), p,
                                   stochastic=bool(getattr(p, "stochastic", True))))
        elif p == "expert" or p.startswith("env:"):
            out.append(PolicyEntry(p, ExpertPolicy(p.partition(":")[2] or p), stochastic=False))
        elif p in SCRIPTED:
            pol = scripted_policy(p)
            out.append(PolicyEntry(p, pol, stochastic=getattr(pol, "stochastic", True)))
        else:
            kind, _, arg = p.partition(":")
            found = policy_factories()
            if kind not in found:
                known = ", ".join([*SCRIPTED, "expert", "env:<key>", *sorted(found)])
                hint = "" if found else (" (model policies come from installed packages through the "
                                         f"'{POLICY_GROUP}' entry-point group; install the agents package: "
                                         "pip install -e '.[train]')")
                raise KeyError(f"unknown policy {p!r}; choose from {known}{hint}")
            try:
                factory = found[kind].load()
                pol = factory(arg or None, name=p, max_new_tokens=max_new_tokens)
            except ImportError as exc:
                raise RuntimeError(f"policy {p!r} ({found[kind].value}) could not be loaded: {exc}") from exc
            out.append(PolicyEntry(p, pol, stochastic=bool(getattr(pol, "stochastic", True)), max_tasks=model_tasks))
    return out


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a success rate ``k / n``."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def episode_row(ep: Episode, policies: RolePolicy | Mapping[str, RolePolicy], task: Any, *, mode: str = "aec",
                seed: int = 0) -> dict[str, Any]:
    """Play one episode with :func:`~envfactory.checks.scripted.play` and describe it as a row
    for :func:`summarize`; an environment or policy that raises fails this episode only
    (``error`` says why)."""
    error = None
    try:
        o = play(ep, policies, task, mode=mode, seed=seed)
    except Exception as exc:  # a crashed environment or policy fails its episode only
        error = f"{type(exc).__name__}: {exc}"
        o = Outcome(env=ep.spec.name, task_id=getattr(task, "id", task), mode=mode, success=False, rewards={},
                    rounds=0, ended_by="error")
    parse_errors = o.errors.get("parse_error", 0)
    return {"env": o.env, "task": o.task_id, "mode": o.mode, "success": o.success, "reward": o.reward,
            "rewards": o.rewards, "turns": o.turns, "rounds": o.rounds, "tool_calls": o.calls,
            "tool_errors": sum(o.errors.values()) - parse_errors, "parse_errors": parse_errors,
            "messages": o.messages, "redundant": o.redundant, "conflicts": o.errors.get("conflict", 0),
            "permission_errors": o.errors.get("permission", 0), "truncated": o.truncated, "ended_by": o.ended_by,
            "error": error}


def summarize(rows: Sequence[dict[str, Any]], agents: Sequence[str] = ()) -> dict[str, Any]:
    """Success, its 95% Wilson interval and per-episode means of episode rows (:func:`episode_row`'s,
    or a model rollout's with the same counts); with ``agents`` (a team's roles), the
    coordination metrics of the module docstring too."""
    n = len(rows)
    wins = [r for r in rows if r["success"]]
    k = len(wins)

    def mean(key: str, of: Sequence[dict[str, Any]] = rows) -> float | None:
        return round(sum(r[key] for r in of) / len(of), 3) if of else None

    out: dict[str, Any] = {
        "episodes": n, "successes": k, "success_rate": round(k / n, 4) if n else None, "ci95": wilson(k, n),
        "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"), "mean_tool_errors": mean("tool_errors"),
        "mean_parse_errors": mean("parse_errors"), "failed_episodes": sum(1 for r in rows if r["error"]),
    }
    if agents:
        out.update({
            "rounds_to_success": mean("rounds", wins),
            "messages_per_success": round(sum(r["messages"] for r in rows) / k, 3) if k else None,
            "messages_per_episode": mean("messages"),
            "redundant_per_episode": mean("redundant"),
            "conflicts_per_episode": mean("conflicts"),
            "permission_errors_per_episode": mean("permission_errors"),
            "reward": {a: round(sum(r["rewards"].get(a, 0.0) for r in rows) / n, 3) if n else None for a in agents},
            "ended_by": {e: sum(r["ended_by"] == e for r in rows) for e in sorted({r["ended_by"] for r in rows})},
        })
    return out


def _run(ep: Episode, team: dict[str, RolePolicy], tasks: list[str], seeds: Sequence[int],
         mode: str) -> list[dict[str, Any]]:
    return [episode_row(ep, team, t, mode=mode, seed=s) for t in tasks for s in seeds]


def evaluate_env(spec: ToolEnvSpec, policies: list[PolicyEntry], *, episodes: int = 2,
                 modes: Sequence[str] = MODES, runtime: str = "local", max_turns: int | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Evaluate every policy on one environment: team metrics, contributions and cross-play."""
    from ..registry import make_multi

    ep = make_multi(spec.name, runtime, max_turns=max_turns)
    agents = spec.agent_ids
    all_tasks = [t.id for t in spec.get_tasks()]
    noop = NoopPolicy()

    def tasks_for(*entries: PolicyEntry) -> list[str]:
        limits = [e.max_tasks for e in entries if e.max_tasks is not None]
        return all_tasks[: min(limits)] if limits else all_tasks

    def seeds_for(*entries: PolicyEntry) -> range:
        return range(episodes) if any(e.stochastic for e in entries) else range(1)

    teams: dict[str, Any] = {}
    contribution: dict[str, Any] = {}
    base_aec: dict[str, float] = {}
    for p in policies:
        start = time.perf_counter()
        tasks, seeds = tasks_for(p), seeds_for(p)
        team = dict.fromkeys(agents, p.policy)
        teams[p.name] = {"tasks": len(tasks), "seeds": len(seeds)}
        for mode in modes:
            rows = _run(ep, team, tasks, seeds, mode)
            teams[p.name][mode] = summarize(rows, agents)
            errors = [r["error"] for r in rows if r["error"]]
            if errors and progress:
                progress(f"{spec.name}: {p.name} ({mode}): {len(errors)} episodes failed, e.g. {errors[0]}")
        base = summarize(_run(ep, team, tasks, seeds, "aec"))["success_rate"] if "aec" not in modes \
            else teams[p.name]["aec"]["success_rate"]
        base_aec[p.name] = base
        contribution[p.name] = {}
        for a in agents:
            without = summarize(_run(ep, {**team, a: noop}, tasks, seeds, "aec"))["success_rate"]
            contribution[p.name][a] = {"team_success": base, "success_without": without,
                                       "contribution": round(base - without, 4)}
        if progress:
            progress(f"{spec.name}: {p.name} team done in {time.perf_counter() - start:.1f}s")

    cross: dict[str, dict[str, float | None]] = {}
    games = competitive(spec)
    matches = []
    for i, row in enumerate(policies):
        cross[row.name] = {}
        for j, col in enumerate(policies):
            if row is col:
                cross[row.name][col.name] = base_aec[row.name]
                continue
            tasks, seeds = tasks_for(row, col), seeds_for(row, col)
            rows = []
            for r in agents:  # seat rotation: row plays each seat in turn, col the others
                seat_rows = _run(ep, {a: (row.policy if a == r else col.policy) for a in agents}, tasks, seeds, "aec")
                rows += seat_rows
                if games and i < j:  # each pair once: (row, col) already holds every seating
                    matches += matches_from_rows(seat_rows, row.name, col.name, r)
            cross[row.name][col.name] = summarize(rows)["success_rate"]
    if progress:
        progress(f"{spec.name}: cross-play done")
    ep.close()
    out = {"name": spec.name, "domain": spec.domain, "agents": agents, "mixed_motive": spec.payoff is not None,
           "competitive": games, "tasks": len(all_tasks), "description": spec.description, "teams": teams,
           "contribution": contribution, "cross_play": cross}
    if games:
        out["rating"] = {"matches": len(matches), "ratings": rate(matches, [p.name for p in policies]),
                         "head_to_head": head_to_head(matches)}
    return out


def evaluate(names: Sequence[str] | None = None, policies: Sequence[Any] = ("oracle", "random", "noop"), *,
             episodes: int = 2, modes: Sequence[str] = MODES, model_tasks: int = 2, max_new_tokens: int = 48,
             runtime: str = "local", max_turns: int | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Evaluate ``policies`` (names or objects, see :func:`build_policies`) on the multi-agent
    environments ``names`` (default: all registered), in ``runtime`` (``local`` or ``docker``),
    ``max_turns`` rounds per episode (default: each environment's own limit).

    Returns the JSON document: ``environments`` (one :func:`evaluate_env` entry
    each), ``summary`` (per policy and mode: success pooled over environments,
    with its interval), and the settings.
    """
    from ..registry import spec as get_spec, specs

    start = time.perf_counter()
    chosen = [get_spec(n) for n in names] if names else [s for s in specs() if getattr(s, "multi_agent", False)]
    for s in chosen:
        if not getattr(s, "multi_agent", False):
            raise ValueError(f"{s.name} is a single-agent environment; team evaluation needs a multi-agent one")
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose from {MODES}")
    entries = build_policies(policies, model_tasks=model_tasks, max_new_tokens=max_new_tokens)
    envs = [evaluate_env(s, entries, episodes=episodes, modes=modes, runtime=runtime, max_turns=max_turns,
                         progress=progress) for s in chosen]
    games = [e["name"] for e in envs if e.get("competitive")]
    matches = [m for e in envs if e.get("competitive") for m in matches_from_head_to_head(e["rating"]["head_to_head"])]
    summary: dict[str, Any] = {}
    for p in entries:
        summary[p.name] = {}
        for mode in modes:
            k, n, failed = (sum(e["teams"][p.name][mode][key] for e in envs)
                            for key in ("successes", "episodes", "failed_episodes"))
            summary[p.name][mode] = {"successes": k, "episodes": n, "success_rate": round(k / n, 4) if n else None,
                                     "ci95": wilson(k, n), "failed_episodes": failed}
    doc = {"policies": [p.name for p in entries], "modes": list(modes), "episodes_per_task": episodes,
           "model_tasks_per_env": model_tasks, "runtime": runtime, "environments": envs, "summary": summary}
    if games:  # pooled over the competitive environments
        doc["rating"] = {"environments": games, "matches": len(matches),
                         "ratings": rate(matches, [p.name for p in entries])}
    doc["seconds"] = round(time.perf_counter() - start, 2)
    return doc


def team_names(env_arg: str) -> list[str] | None:
    """For ``envfactory eval --env``: the multi-agent names it asks for (``multi`` means all),
    or ``None`` when it names a single-agent environment (the single-agent evaluation's job)."""
    from ..registry import spec as get_spec, specs

    names = [n.strip() for n in env_arg.split(",") if n.strip()]
    if names == ["multi"]:
        return [s.name for s in specs() if getattr(s, "multi_agent", False)]
    try:
        return names if names and all(getattr(get_spec(n), "multi_agent", False) for n in names) else None
    except KeyError:
        return None


def run_and_report(names: Sequence[str] | None, policies: Sequence[Any], *, out: str, **settings: Any
                   ) -> tuple[int, Any, str]:
    """:func:`evaluate` (``settings``: its keyword arguments), write the report into ``out``, and
    summarise; returns ``(code, json, text)``."""
    import sys

    from .report import write_report

    try:
        doc = evaluate(names, policies, progress=lambda msg: print(msg, file=sys.stderr, flush=True), **settings)
    except (KeyError, ValueError, RuntimeError) as exc:
        msg = str(exc.args[0] if isinstance(exc, KeyError) else exc)
        return 2, {"error": msg}, "error: " + msg
    paths = write_report(doc, out)
    doc["report"] = paths
    lines = [f"{'policy':<10}{'mode':<10}{'success':>8}  95% CI        episodes"]
    for p, by_mode in doc["summary"].items():
        for mode, s in by_mode.items():
            lo, hi = s["ci95"]
            lines.append(f"{p:<10}{mode:<10}{s['success_rate'] or 0:>8.2f}  [{lo:.2f}, {hi:.2f}]  {s['episodes']:>6}")
    failed = sum(s["failed_episodes"] for by_mode in doc["summary"].values() for s in by_mode.values())
    if "rating" in doc:
        lines.append(f"rating over {', '.join(doc['rating']['environments'])} ({doc['rating']['matches']} matches):")
        for p, r in doc["rating"]["ratings"].items():
            lines.append(f"  {p:<10}{r['rating']:>8.1f} +/- {r['sd']:.1f}  (score {r['score']}, {r['matches']} matches)")
    if failed:
        lines.append(f"{failed} episodes failed (an environment or policy raised; the messages are above)")
    lines.append(f"report: {paths['markdown']} (JSON: {paths['json']}), {doc['seconds']}s")
    return (1 if failed else 0), doc, "\n".join(lines)
