"""verl: envfactory episodes as verl agent loops, token-in/token-out, ARPO's forked groups included.

verl (``pip install verl``; tested with 0.9.0) rolls out through *agent loops*: its
``AgentLoopWorker`` instantiates the loop registered under a dataset row's ``agent_name`` once per
trajectory and awaits ``run(sampling_params, **row)``, which returns one ``AgentLoopOutput``
(prompt ids, response ids, a response mask, log-probs, a reward). This module registers two::

    from envfactory.faces.verl import register_verl, verl_rows
    rows = verl_rows("Counter-v0", split="rl")     # verl's dataset (to parquet), one row a task
    register_verl()                                # verl imported now; "envfactory", "envfactory_arpo"
    # or, in verl's config: actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loops.yaml

* **envfactory** (:class:`EnvfactoryAgentLoop`): one episode of the row's environment and task.
  The prompt is the episode's opening messages rendered with the tool schemas by verl's own
  ``apply_chat_template`` (the tokenizer's chat template, as verl's ``ToolAgentLoop`` does); each
  turn is one ``server_manager.generate`` on the ids so far, whose sampled ids go into the response
  with mask 1 and their log-probs; their text is one ``step`` of the episode's referee (which parses
  the tool calls: Hermes ``<tool_call>`` blocks, or the final answer); the tool responses (or a
  conversation task's next user message) are rendered by the chat template as verl renders tool
  turns (its turn separator first, the generation prompt last) and appended with mask 0 and
  log-prob 0. ``reward_score`` is the episode's reward (1.0 on success, judged from the true final
  state), so verl's reward loop is not asked; ``extra_fields["envfactory"]`` says the task, success,
  how it ended, turns, tool errors and the final state's hash. The episode ends as ``make(NAME)``'s
  does (an answer without a tool call, ``finish``, its turn limit), or when the response would
  outgrow ``rollout.response_length`` (or ``multi_turn.max_assistant_turns`` is reached): reward 0,
  ``ended_by`` ``"response_length"`` / ``"max_assistant_turns"``.
* **envfactory_arpo** (:class:`EnvfactoryARPOAgentLoop`): ARPO's group. ``run_group`` plays ``M``
  samples of the row's task: ``N`` initial episodes, each forked from one opening; after a turn
  whose tool calls all succeeded, a sample is forked (token prefix *and* envfactory world: every
  branch has its own copy of the world) before its next turn, and once that turn is played, a
  branch is kept with probability ``clip(alpha + beta * dH_scaled, 0, 1)`` (``dH``: the turn's
  entropy over the first turn's, each the mean surprisal ``-log p`` of the first ``k`` sampled
  tokens, since verl's servers return the sampled tokens' log-probs only; scaled by the RMS of the
  round's ``dH``); ``Z`` branches per decision, exactly ``M`` samples (unused budget filled with
  fresh episodes). verl calls ``run`` once per trajectory and wants one output back, and its trainer
  repeats each prompt ``rollout.n`` times (one ``uid`` per prompt), so ``run`` serves the group:
  the first of the ``rollout.n`` calls that share a ``uid`` plays the group (``M = rollout.n``),
  and each call takes the next sample. verl needs no change for that, given one condition: a
  prompt's ``rollout.n`` copies run in one ``AgentLoopWorker`` process (``AgentLoopManager`` cuts
  the batch into equal contiguous chunks, one per worker: true when ``agent.num_workers`` divides
  the number of prompts in a batch; otherwise a split group is played once in each worker, every
  sample still a valid episode). ``examples/verl/run_group.patch`` is the change offered upstream
  that makes a group one call (``run_group`` called once per ``uid``, chunks cut on ``uid``).
  Validation: set ``val_kwargs.n`` to ``rollout.n`` or give validation rows ``agent_name:
  envfactory``. ARPO's settings: the row's ``extra_info["arpo"]`` (``N``, ``k``, ``alpha``,
  ``beta``, ``Z``, ``branch_after``, ``seed``; defaults :data:`ARPO_DEFAULTS`).

Rows (:func:`verl_rows`) carry ``prompt`` (the opening messages, for verl's dataset filters),
``agent_name``, ``data_source``, ``reward_model`` and ``extra_info`` (``env_name``, ``task_id``,
``split``, ``index``); the loop reads ``env_name`` and ``task_id`` (or ``seed``, drawn from
``split``, default ``rl``) from the row or its ``extra_info``, and ``runtime``. A row without an
environment, an unknown environment, task or split, or a team environment is a ``ValueError`` or
``KeyError`` naming it.

Importing this module does not import verl: :func:`agent_loop_classes` builds (and registers) the
classes on first use, as module attributes (``EnvfactoryAgentLoop``, ``EnvfactoryARPOAgentLoop``), so
the ``_target_`` strings ``envfactory.faces.verl.EnvfactoryAgentLoop`` /
``envfactory.faces.verl.EnvfactoryARPOAgentLoop`` are all verl's Hydra-based registry needs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

__all__ = ["AGENT_NAME", "ARPO_AGENT_NAME", "ARPO_DEFAULTS", "agent_loop_classes", "register_verl", "verl_rows"]

AGENT_NAME = "envfactory"
ARPO_AGENT_NAME = "envfactory_arpo"
DEFAULT_SPLIT = "rl"
INSTALL = "pip install 'verl==0.9.*' (with transformers<5.11)"
ARPO_DEFAULTS: dict[str, Any] = {"N": None, "k": 20, "alpha": 0.5, "beta": 0.2, "Z": 1,
                                 "branch_after": "valid_tool_result", "seed": None}
"""ARPO's settings for a group (agents' ``ARPO`` defaults); ``N`` ``None``: half of ``M``, at least 1."""
MAX_PENDING_GROUPS = 1024  # groups whose samples were not all taken (validation with a smaller n) are dropped


# -- dataset rows ------------------------------------------------------------------------------
def verl_rows(name: str, split: str = DEFAULT_SPLIT, *, tasks: list[str] | None = None,
              agent_name: str = AGENT_NAME, arpo: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """verl dataset rows, one per task of ``split`` (or the named ``tasks``): ``prompt`` (the
    episode's opening system and user messages), ``agent_name``, ``data_source``
    (``envfactory/NAME``), ``reward_model`` (``{"style": "envfactory", "ground_truth": task_id}``:
    the loop computes the reward) and ``extra_info`` (``env_name``, ``task_id``, ``split``,
    ``index``; ``arpo`` when given). Write them with ``datasets.Dataset.from_list(rows).to_parquet``."""
    from ..registry import spec

    s = spec(name)
    if s.multi_agent:
        raise ValueError(f"{name} is a team environment; envfactory's verl agent loops play single-agent ones")
    if arpo is not None:
        _arpo_settings(arpo)  # refused now, not in the rollout
    members = _members(split)
    ids = list(tasks) if tasks is not None else [t.id for t in s.get_tasks() if s.split(t.id) in members]
    env = _make(name, "local", "all")
    rows = []
    try:
        for index, task_id in enumerate(ids):
            opening = env.reset(task=task_id)
            extra: dict[str, Any] = {"env_name": name, "task_id": task_id, "split": s.split(task_id), "index": index}
            if arpo is not None:
                extra["arpo"] = dict(arpo)
            rows.append({"data_source": f"envfactory/{name}", "agent_name": agent_name,
                         "prompt": [{"role": m["role"], "content": m["content"]} for m in opening],
                         "reward_model": {"style": "envfactory", "ground_truth": task_id},
                         "extra_info": extra})
    finally:
        env.close()
    return rows


def _members(split: str) -> set[str]:
    from ..definition import split_members

    return set(split_members(split))


def _make(name: str, runtime: str, split: str) -> Any:
    from ..registry import make, spec

    s = spec(name)  # KeyError naming the nearest environments
    if s.multi_agent:
        raise ValueError(f"{name} is a team environment; envfactory's verl agent loops play single-agent ones")
    return make(name, runtime, split=split)  # type: ignore[arg-type]


# -- one sample: a token sequence and its own episode -----------------------------------------------
@dataclass(eq=False)
class _Play:
    """One sample being played: its tokens and its episode (its own world)."""

    episode: Any
    prompt_ids: list[int]
    request_id: str
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    has_logprobs: bool = False
    turn_h: list[float] = field(default_factory=list)  # per assistant turn: mean surprisal of its first k tokens
    assistant_turns: int = 0
    observation_turns: int = 0
    last_valid: bool = False  # the last turn's tool calls all succeeded (at least one)
    done: bool = False
    reward: float = 0.0
    ended_by: str | None = None
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    kind: str = "single"
    index: int = 0
    parent: int = -1
    shared: int = 0  # response tokens shared with the parent (a branch's prefix)
    metrics: dict[str, float] = field(default_factory=lambda: {"generate_sequences": 0.0, "tool_calls": 0.0})

    async def fork(self, *, request_id: str | None = None) -> "_Play":
        episode = await self.episode.aio.fork()  # its own copy of the world
        return dataclasses.replace(self, episode=episode, request_id=request_id or self.request_id,
                                   prompt_ids=list(self.prompt_ids), response_ids=list(self.response_ids),
                                   mask=list(self.mask), logprobs=list(self.logprobs), turn_h=list(self.turn_h),
                                   info=dict(self.info), metrics=dict(self.metrics))

    def close(self) -> None:
        try:
            self.episode.close()
        except Exception:  # a dead container must not kill the rollout
            pass


def _row(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The row's envfactory fields: from the row itself, else its ``extra_info``."""
    extra = kwargs.get("extra_info")
    extra = extra if isinstance(extra, dict) else {}
    out: dict[str, Any] = {}
    for key in ("env_name", "task_id", "seed", "split", "runtime", "arpo", "group_size"):
        value: Any = kwargs.get(key)
        if value is None:
            value = extra.get(key)
        out[key] = value.item() if hasattr(value, "item") and not isinstance(value, dict) else value
    if not out["env_name"] or not isinstance(out["env_name"], str):
        raise ValueError("envfactory's verl agent loop needs the row's env_name (in the row or its extra_info; "
                         f"envfactory.faces.verl.verl_rows writes it); the row has {sorted(kwargs)}")
    if out["task_id"] is None and out["seed"] is None:
        raise ValueError(f"envfactory's verl agent loop needs the row's task_id or seed (env_name "
                         f"{out['env_name']!r}); the row has {sorted(kwargs)}")
    return out


def _arpo_settings(given: Any) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ValueError(f"extra_info['arpo'] must be a mapping of ARPO's settings, not {type(given).__name__}")
    unknown = sorted(set(given) - set(ARPO_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown ARPO settings {unknown}; known: {sorted(ARPO_DEFAULTS)}")
    out = {**ARPO_DEFAULTS, **given}
    if out["branch_after"] not in ("valid_tool_result", "any"):
        raise ValueError(f"branch_after must be 'valid_tool_result' or 'any', not {out['branch_after']!r}")
    if int(out["k"]) < 1 or int(out["Z"]) < 1:
        raise ValueError(f"ARPO's k and Z must be at least 1 (got k={out['k']}, Z={out['Z']})")
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


@functools.cache
def agent_loop_classes() -> tuple[type, type]:
    """``(EnvfactoryAgentLoop, EnvfactoryARPOAgentLoop)``, built on verl's ``AgentLoopBase`` and
    registered with verl's ``register`` as ``"envfactory"`` and ``"envfactory_arpo"`` (verl imported
    now; ``ImportError`` naming the package when it is missing)."""
    try:
        from verl.experimental.agent_loop import agent_loop as verl_agent_loop
    except ImportError as exc:
        raise ImportError(f"envfactory's verl agent loops need verl ({INSTALL}): {exc}") from exc

    base: Any = verl_agent_loop.AgentLoopBase  # (typed Any: mypy runs with or without verl installed)
    output_cls: Any = verl_agent_loop.AgentLoopOutput
    metrics_cls: Any = verl_agent_loop.AgentLoopMetrics
    register: Any = verl_agent_loop.register

    class EnvfactoryAgentLoop(base):
        """One envfactory episode per ``run`` (see :mod:`envfactory.faces.verl`)."""

        def __init__(self, *args: Any, tools: Any = None, name: Any = None, **kwargs: Any) -> None:
            # ``tools``: verl's own tool list (unused: the environment's tools are the episode's);
            # ``name``: an agent_loop_config_path entry's name, passed on by Hydra
            super().__init__(*args, **kwargs)
            self.response_length = int(self.rollout_config.response_length)
            multi_turn = self.rollout_config.get("multi_turn") or {}
            limit = multi_turn.get("max_assistant_turns") if hasattr(multi_turn, "get") else None
            self.max_assistant_turns = int(limit) if limit else None

        # -- an episode, token by token
        async def _open(self, row: dict[str, Any]) -> _Play:
            split = str(row["split"] or DEFAULT_SPLIT)
            runtime = str(row["runtime"] or "local")
            episode = await self.loop.run_in_executor(None, lambda: _make(row["env_name"], runtime, split))
            try:
                if row["task_id"] is not None:
                    messages = await episode.aio.reset(task=str(row["task_id"]))
                else:
                    messages = await episode.aio.reset(seed=int(row["seed"]))
                schemas = episode.tool_schemas()
                prompt_ids = await self.apply_chat_template(
                    [{"role": m["role"], "content": m["content"]} for m in messages], tools=schemas)
            except BaseException:
                episode.close()
                raise
            return _Play(episode, list(prompt_ids), uuid4().hex)

        async def _turn(self, play: _Play, sampling_params: dict[str, Any], k: int = ARPO_DEFAULTS["k"]) -> None:
            """One assistant turn of ``play``: generate, step the episode, append the observation."""
            start = time.perf_counter()
            out = await self.server_manager.generate(request_id=play.request_id,
                                                     prompt_ids=play.prompt_ids + play.response_ids,
                                                     sampling_params=sampling_params)
            play.metrics["generate_sequences"] += time.perf_counter() - start
            ids = list(out.token_ids)
            logprobs = list(out.log_probs) if out.log_probs is not None else None
            room = self.response_length - len(play.response_ids)
            cut = len(ids) > room
            ids = ids[:room]
            play.response_ids += ids
            play.mask += [1] * len(ids)
            if logprobs is not None:
                play.has_logprobs = True
                play.logprobs += [float(x) for x in logprobs[:len(ids)]]
            else:
                play.logprobs += [0.0] * len(ids)
            play.turn_h.append(_mean([-float(x) for x in (logprobs or [])[:min(k, len(ids))]]))
            play.assistant_turns += 1
            if cut:
                return self._stop(play, "response_length")
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            before = dict(play.info)
            start = time.perf_counter()
            result = await play.episode.aio.step(text)
            play.metrics["tool_calls"] += time.perf_counter() - start
            play.info = dict(result.info)
            calls = int(result.info.get("tool_calls") or 0) - int(before.get("tool_calls") or 0)
            failed = any(int(result.info.get(key) or 0) > int(before.get(key) or 0)
                         for key in ("tool_errors", "parse_errors"))
            play.last_valid = calls > 0 and not failed
            if result.done:
                play.done, play.reward = True, float(result.reward)
                play.ended_by = str(result.info.get("ended_by") or ("turn_limit" if result.truncated else "answer"))
                play.success = bool(result.info.get("success"))
                return None
            if self.max_assistant_turns is not None and play.assistant_turns >= self.max_assistant_turns:
                return self._stop(play, "max_assistant_turns")
            messages = [{"role": m["role"], "content": m["content"]} for m in result.messages
                        if m["role"] != "assistant"]
            obs = list(self.turn_separator) + list(await self.apply_chat_template(messages,
                                                                                   remove_system_prompt=True))
            if len(play.response_ids) + len(obs) >= self.response_length:
                return self._stop(play, "response_length")
            play.response_ids += obs
            play.mask += [0] * len(obs)
            play.logprobs += [0.0] * len(obs)
            play.observation_turns += 1
            return None

        @staticmethod
        def _stop(play: _Play, how: str) -> None:
            play.done, play.reward, play.ended_by, play.success = True, 0.0, how, False

        def _output(self, play: _Play) -> Any:
            facts = {"env_name": play.episode.spec.name, "task_id": play.info.get("task_id") or _task_id(play),
                     "success": play.success, "ended_by": play.ended_by, "reward": play.reward,
                     "turns": play.assistant_turns, "tool_calls": int(play.info.get("tool_calls") or 0),
                     "tool_errors": int(play.info.get("tool_errors") or 0), "state_hash": _state_hash(play),
                     "kind": play.kind, "index": play.index, "parent": play.parent, "shared_tokens": play.shared,
                     "served_by": "run_group" if play.kind != "single" else "run"}
            return output_cls(
                prompt_ids=play.prompt_ids, response_ids=play.response_ids[:self.response_length],
                response_mask=play.mask[:self.response_length],
                response_logprobs=play.logprobs[:self.response_length] if play.has_logprobs else None,
                reward_score=play.reward, num_turns=play.assistant_turns + play.observation_turns + 1,
                metrics=metrics_cls(**play.metrics), extra_fields={"envfactory": facts})

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            play = await self._open(_row(kwargs))
            try:
                while not play.done:
                    await self._turn(play, sampling_params)
                return self._output(play)
            finally:
                play.close()

    class EnvfactoryARPOAgentLoop(EnvfactoryAgentLoop):
        """ARPO's group of ``M`` forked samples (see :mod:`envfactory.faces.verl`): ``run_group``
        returns them all; ``run`` hands them out one per call of the prompt's ``uid``."""

        _groups: OrderedDict[str, dict[str, Any]] = OrderedDict()  # per uid, in this worker process

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            uid = kwargs.get("uid")
            if uid is None:
                raise ValueError("envfactory's ARPO agent loop serves one group per prompt uid (verl's trainer sets "
                                 "non_tensor_batch['uid']); this row has none: call run_group(sampling_params, m, "
                                 "**row) for a group, or use agent_name 'envfactory' for single episodes")
            key = str(uid)
            groups = type(self)._groups
            entry = groups.get(key)
            if entry is None:
                row = _row(kwargs)
                m = int(row["group_size"] or self.rollout_config.n)
                task = asyncio.ensure_future(self.run_group(sampling_params, m, **kwargs))
                entry = groups[key] = {"task": task, "taken": 0, "m": m}
                while len(groups) > MAX_PENDING_GROUPS:
                    groups.popitem(last=False)
            i = entry["taken"]
            entry["taken"] += 1
            if entry["taken"] >= entry["m"]:
                groups.pop(key, None)
            if i >= entry["m"]:
                raise ValueError(f"prompt uid {key}: more calls than its group of {entry['m']} samples (rollout.n "
                                 "and the row's group_size must agree)")
            outputs = await asyncio.shield(entry["task"])
            outputs[i].extra_fields["envfactory"]["served_by"] = "run"  # one of the uid's calls
            return outputs[i]

        async def run_group(self, sampling_params: dict[str, Any], m: int, **kwargs: Any) -> list[Any]:
            """ARPO's ``m`` samples of the row's task, each with its own forked world, in order of
            creation (initial, then branches and fills); ``extra_fields["envfactory"]`` names each
            one's ``kind``, ``parent`` and ``shared_tokens``."""
            if m < 1:
                raise ValueError(f"a group needs at least one sample (got {m})")
            row = _row(kwargs)
            s = _arpo_settings(row["arpo"])
            n = int(s["N"]) if s["N"] is not None else max(1, m // 2)
            if not 1 <= n <= m:
                raise ValueError(f"ARPO needs 1 <= N <= M, got N={n}, M={m}")
            k, z, alpha, beta = int(s["k"]), int(s["Z"]), float(s["alpha"]), float(s["beta"])
            any_obs = s["branch_after"] == "any"
            rng = random.Random(s["seed"])
            template = await self._open(row)
            plays: list[_Play] = []
            opened: list[_Play] = [template]  # every episode this group made, closed at the end (idempotent)
            try:
                async def new(kind: str) -> _Play:
                    play = await template.fork(request_id=uuid4().hex)
                    opened.append(play)
                    play.kind, play.index = kind, len(plays)
                    plays.append(play)
                    return play

                live = [await new("initial") for _ in range(n)]
                fresh: set[int] = set()  # branches about to play their first turn: the point they branched from
                while True:
                    active = [p for p in live if not p.done]
                    if not active:
                        if len(plays) >= m:
                            break
                        live += [await new("fill") for _ in range(m - len(plays))]
                        continue
                    pre: dict[int, _Play] = {}
                    for p in active:
                        if (p.index in fresh or m - len(plays) < z or not p.assistant_turns
                                or not (any_obs or p.last_valid)):
                            continue
                        pre[p.index] = await p.fork()
                        opened.append(pre[p.index])
                    fresh = set()
                    await asyncio.gather(*(self._turn(p, sampling_params, k) for p in active))
                    deciding = [(p.turn_h[-1] - p.turn_h[0], p, pre[p.index]) for p in active if p.index in pre]
                    scale = math.sqrt(_mean([d * d for d, _, _ in deciding])) if deciding else 0.0
                    for delta_h, p, fork in sorted(deciding, key=lambda d: -d[0]):
                        score = delta_h / scale if scale > 1e-8 else 0.0
                        prob = min(1.0, max(0.0, alpha + beta * score)) if beta else min(1.0, max(0.0, alpha))
                        if rng.random() >= prob or m - len(plays) < z:
                            fork.close()
                            continue
                        siblings = [await fork.fork(request_id=uuid4().hex) for _ in range(z - 1)]
                        opened += siblings
                        for c in [fork, *siblings]:
                            c.kind, c.index, c.parent, c.shared = "branch", len(plays), p.index, len(c.response_ids)
                            plays.append(c)
                            live.append(c)
                            fresh.add(c.index)
                return [self._output(p) for p in plays]
            finally:
                for p in opened:
                    p.close()

    for cls in (EnvfactoryAgentLoop, EnvfactoryARPOAgentLoop):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__  # Hydra's _target_: the module attribute
    register(AGENT_NAME)(EnvfactoryAgentLoop)
    register(ARPO_AGENT_NAME)(EnvfactoryARPOAgentLoop)
    return EnvfactoryAgentLoop, EnvfactoryARPOAgentLoop


def _task_id(play: _Play) -> str | None:
    task = play.episode.task
    return None if task is None else str(task.id)


def _state_hash(play: _Play) -> str | None:
    try:
        return str(play.episode.state.hash())
    except Exception:  # a world that is gone has no state to show
        return None


def register_verl() -> tuple[str, str]:
    """Build and register the agent loops in verl's registry; returns their names
    (``"envfactory"``, ``"envfactory_arpo"``)."""
    agent_loop_classes()
    return AGENT_NAME, ARPO_AGENT_NAME


def __getattr__(name: str) -> Any:
    if name == "EnvfactoryAgentLoop":
        return agent_loop_classes()[0]
    if name == "EnvfactoryARPOAgentLoop":
        return agent_loop_classes()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
