"""TRL's ``GRPOTrainer`` on any envfactory environment, in its environment mode.

TRL (>= 1.x) trains on stateful, multi-turn environments through ``GRPOTrainer(environment_factory=...)``:
one environment instance per rollout, its public methods are the tools the model may call, ``reset(**row)``
starts a rollout from a dataset row. This module turns any registered single-agent envfactory
environment into that shape::

    from agents.harness.trl_env import TRLEnvironment, prepare_tokenizer
    env = TRLEnvironment("FindLight-v0", split="rl")
    trainer = GRPOTrainer(model=model, processing_class=prepare_tokenizer(tokenizer),
                          train_dataset=env.dataset(), environment_factory=env.factory,
                          reward_funcs=env.reward, args=GRPOConfig(...))

* **Tools.** Each instance is one :class:`envfactory.Episode` (``envfactory.make(NAME, runtime)``), and
  has one method per environment tool (``finish`` included), generated from the tool's JSON schema
  (name, description, typed parameters, enum choices), so TRL renders them in the prompt and calls them.
  A call is one turn of the episode's referee (arguments validated strictly, turn limit, log): the method
  returns the observation text, errors included (an error is an observation, as in ``make``).
* **Tasks.** :meth:`TRLEnvironment.dataset` has one row per task (``prompt``: the episode's opening
  system + user messages; ``task_id``), from a split (``rl`` by default: never ``eval``) or a task list;
  ``reset(task_id=...)`` starts that task.
* **Reward.** Sparse, from the environment, never from the text: :meth:`TRLEnvironment.reward` (a
  ``reward_funcs`` entry; TRL passes it the rollouts' environments) ends each episode the way ``make``
  does -- the last assistant message, which made no tool call, is the final answer -- and returns the
  episode's reward (1.0 on success). A rollout cut off before answering scores 0 (its episode is not
  done). Each tool call is one turn (``make`` given one call per step); a call of a tool the environment
  lacks never reaches it (TRL answers "Tool X not found" itself). ``shaping=c`` adds ``c`` x (tool calls that ran without error / tool calls, 0 when none) to the
  sparse reward, a documented partial credit from the episode's log for models that rarely succeed yet;
  the default (0) is the environment's reward alone. Each rollout is also recorded in
  :attr:`TRLEnvironment.history` (task id, the episode's reward and success, its calls and final answer,
  the value returned to TRL), so it can be replayed through ``envfactory.make``.
* **Conversations.** A TRL rollout ends at the model's first completion without a tool call, so for an
  environment with conversation tasks (:mod:`envfactory.conversation`) each instance also has
  ``reply_to_user(message)``: the model's words to the user as a call, whose result is the user's next
  message (the facts asked for, or the next request); the last answer, without a call, ends it as usual.
* **Parsing.** TRL parses tool calls out of completions through ``tokenizer.parse_response``, which
  needs a response template TRL knows only for a few model families. :func:`prepare_tokenizer` gives
  the tokenizer envfactory's own parser (:func:`envfactory.parsing.parse_text`: Hermes ``<tool_call>``
  blocks, several per message, or a bare JSON call), so any model whose template renders Hermes calls
  (the embedded tiny model, Qwen) works; calls TRL then runs are exactly those ``make`` would run.
"""

from __future__ import annotations

import inspect
import json
import threading
import types
from typing import Any, Callable

import envfactory
from envfactory import ToolCall
from envfactory.parsing import parse_text

__all__ = ["TRLEnvironment", "EnvfactoryTRLEnv", "prepare_tokenizer", "parse_response", "sampled_mask", "turn_markers"]

_JSON_TYPES: dict[str, Any] = {"integer": int, "number": float, "string": str, "boolean": bool, "array": list,
                               "object": dict}
_UNSET: Any = inspect.Parameter.empty
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")
# a conversation's answers in TRL: a rollout ends at the first completion without a tool call, so each
# answer but the last is a call of this method, whose result is the user's next message
REPLY = "reply_to_user"


class EnvfactoryTRLEnv:
    """One rollout's environment (TRL creates and pools instances through the factory). Subclasses made by
    :class:`TRLEnvironment` add one method per tool."""

    _name: str = ""
    _runtime: str = "local"
    _max_turns: int | None = None
    _owner: "TRLEnvironment | None" = None

    def __init__(self) -> None:
        self._episode = envfactory.make(self._name, self._runtime, max_turns=self._max_turns)
        self._calls: list[tuple[str, dict[str, Any]]] = []  # the calls TRL made (run or not)

    def reset(self, task_id: str | None = None, **row: Any) -> str | None:
        """Start the row's task (``task_id``; else ``seed``, else a random task). The row's prompt already
        holds the instruction, so nothing is appended to it."""
        seed = row.get("seed")
        self._episode.reset(task_id, seed=seed) if task_id is not None else self._episode.reset(seed=seed)
        self._calls = []
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        ep = self._episode
        if ep.task is None:
            return "Error: no episode (reset was not called)"
        self._calls.append((name, dict(arguments)))
        if ep.done:
            return f"Error: the episode has ended ({ep.status.ended_by}); no more tool calls are run."
        r = ep.step([ToolCall(name, arguments)])
        return "\n".join(str(m.get("content", "")) for m in r.messages) or "(no output)"

    def reply_to_user(self, message: str) -> str:
        """Answer the user in words and hear what they say next (a conversation: a task of several
        user turns, or a user who holds facts you must ask for). Use it to ask the user something
        or to tell them what you did; your last words, given without any call, end the conversation.

        Args:
            message: What you say to the user.
        """
        ep = self._episode
        if ep.task is None:
            return "Error: no episode (reset was not called)"
        self._calls.append((REPLY, {"message": message}))
        if ep.done:
            return f"Error: the conversation has ended ({ep.status.ended_by})."
        r = ep.step(str(message))
        if ep.done:
            return "(the user has nothing more to say)"
        return "\n".join(str(m.get("content", "")) for m in r.messages)

    def _finish(self, final_text: str | None) -> dict[str, Any]:
        """End the episode with the rollout's final answer (as ``make`` would) and report it."""
        ep = self._episode
        if ep.task is not None and not ep.done and final_text is not None:
            ep.step(final_text)
        log = ep.status.log if ep.task is not None else []
        return {"task_id": ep.task.id if ep.task is not None else None, "done": ep.done,
                "reward": ep.rewards[ep.agents[0]] if ep.task is not None else 0.0, "success": ep.success,
                "ended_by": ep.status.ended_by, "tool_calls": len(log), "tool_ok": sum(e["ok"] for e in log),
                "calls": list(self._calls), "answer": final_text}


def _tool_method(tool: Any) -> Callable[..., str]:
    """A method ``name(self, **arguments) -> str`` whose signature and Google docstring reproduce the
    tool's JSON schema for ``transformers.utils.get_json_schema`` (what TRL renders in the prompt)."""
    props = tool.parameters.get("properties", {}) or {}
    required = set(tool.parameters.get("required", []) or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}  # no return annotation: the rendered schema is the tool's, nothing more
    arg_lines = []
    for pname, p in props.items():
        ptype = p.get("type")
        if isinstance(ptype, list):
            ptype = next((t for t in ptype if t != "null"), "string")
        if ptype is None and "anyOf" in p:
            ptype = next((a.get("type") for a in p["anyOf"] if a.get("type") not in (None, "null")), "string")
        ann = _JSON_TYPES.get(ptype or "string", str)
        annotations[pname] = ann
        default = _UNSET if pname in required else None
        params.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann))
        desc = " ".join(str(p.get("description") or pname).split())
        if p.get("enum"):
            desc += f" (choices: {json.dumps(p['enum'])})"
        arg_lines.append(f"    {pname}: {desc}")
    name = tool.name

    def method(self: EnvfactoryTRLEnv, **arguments: Any) -> str:
        # arguments the model left out are not sent (the tool's own defaults apply)
        return self._call(name, {k: v for k, v in arguments.items() if not (v is None and k not in required)})

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    doc = " ".join((tool.description or name).split())
    if arg_lines:
        doc += "\n\nArgs:\n" + "\n".join(arg_lines)
    method.__doc__ = doc
    return method


class TRLEnvironment:
    """An envfactory environment in the shape TRL's ``GRPOTrainer(environment_factory=...)`` takes.

    Args:
        name: A registered single-agent environment.
        split: Which tasks :meth:`dataset` lists (``rl`` by default; ``sft``, ``eval`` or ``all``).
        tasks: Task ids instead of a split.
        runtime: ``local`` or ``docker`` (as for :func:`envfactory.make`).
        max_turns: Overrides the environment's turn limit (each tool call is one turn).
        shaping: Weight of the partial credit (share of tool calls that ran without error) added to the
            sparse reward; 0 (default): the environment's reward alone.
    """

    def __init__(self, name: str, *, split: str = "rl", tasks: list[str] | None = None, runtime: str = "local",
                 max_turns: int | None = None, shaping: float = 0.0) -> None:
        self.spec = envfactory.spec(name)
        if self.spec.multi_agent:
            raise ValueError(f"{self.spec.name} is a team environment; GRPOTrainer trains one agent")
        self.name, self.split, self.shaping = self.spec.name, split, float(shaping)
        if tasks is not None:
            self.tasks = [self.spec.task(t) for t in tasks]
        elif split == "all":
            self.tasks = list(self.spec.get_tasks())
        else:
            self.tasks = list(self.spec.tasks_in(split))
        if not self.tasks:
            raise ValueError(f"{self.name}: no tasks in split {split!r}")
        methods = {t.name: _tool_method(t) for t in self.spec.tools_of().values()}
        clash = sorted(set(methods) & {"reset", "get_reward", REPLY} | {m for m in methods if m.startswith("_")})
        if clash:
            raise ValueError(f"{self.name}: tool names {clash} clash with TRL's environment protocol")
        cls_name = "".join(ch for ch in self.name.title() if ch.isalnum()) + "TRLEnv"
        if not any(t.conversation is not None for t in self.tasks):  # a tool only conversations have
            methods[REPLY] = None  # type: ignore[assignment]
        self.env_class: type[EnvfactoryTRLEnv] = type(cls_name, (EnvfactoryTRLEnv,), {
            "_name": self.name, "_runtime": runtime, "_max_turns": max_turns, "_owner": self, **methods})
        self.history: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def factory(self) -> EnvfactoryTRLEnv:
        """``environment_factory``: a fresh instance (one episode) per rollout slot."""
        return self.env_class()

    def dataset(self, repeat: int = 1) -> Any:
        """A ``datasets.Dataset``: ``prompt`` (system + instruction, as ``make(NAME).reset(task)`` opens)
        and ``task_id``, one row per task (``repeat`` times)."""
        from datasets import Dataset

        ep = envfactory.make(self.name)
        rows: dict[str, list[Any]] = {"prompt": [], "task_id": []}
        for _ in range(repeat):
            for t in self.tasks:
                rows["prompt"].append(ep.reset(t.id))
                rows["task_id"].append(t.id)
        ep.close()
        return Dataset.from_dict(rows)

    def reward(self, completions: list[Any], environments: list[EnvfactoryTRLEnv] | None = None,
               prompts: list[Any] | None = None, completion_ids: list[list[int]] | None = None,
               **kwargs: Any) -> list[float]:
        """The environment's reward for each rollout (see the module docstring). The rollout's prompt and
        completion token ids, when TRL passes them, are kept in its history row (``prompt``,
        ``completion_ids``: what the model sampled, the tool results TRL appended included)."""
        if environments is None:
            raise ValueError("envfactory's reward needs the rollouts' environments: pass environment_factory")
        out = []
        for i, (completion, env) in enumerate(zip(completions, environments, strict=True)):
            final = None
            if isinstance(completion, list) and completion:
                last = completion[-1]
                if last.get("role") == "assistant" and not last.get("tool_calls"):
                    content = last.get("content")
                    final = content if isinstance(content, str) else ""
            elif isinstance(completion, str):
                final = completion
            row = env._finish(final)
            r = float(row["reward"])
            if self.shaping and row["tool_calls"]:
                r += self.shaping * row["tool_ok"] / row["tool_calls"]
            row["returned"] = r
            if prompts is not None:
                row["prompt"] = prompts[i]
            if completion_ids is not None:
                row["completion_ids"] = [int(x) for x in completion_ids[i]]
            with self._lock:
                self.history.append(row)
            out.append(r)
        return out

    def completion_logprobs(self, model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> list[float]:
        """The mean log-probability per token that ``model`` gives the tokens each history row's model
        sampled (its ``completion_ids`` less the tool results TRL appended: :func:`sampled_mask`), after
        its prompt, rendered with this environment's tools as TRL renders it.

        With the weights before and after training, the difference says in which direction training
        moved each completion, whatever the starting success rate: a learning signal that does not
        need headroom. Rows without ``completion_ids`` (TRL did not pass them) are an error."""
        import torch

        inst = self.factory()
        tools = [getattr(inst, n) for n, _ in inspect.getmembers(type(inst), predicate=inspect.isfunction)
                 if n not in ("reset", "get_reward") and not n.startswith("_")]
        device = next(model.parameters()).device
        markers = turn_markers(tokenizer)
        out = []
        with torch.no_grad():
            for row in rows:
                if "completion_ids" not in row or "prompt" not in row:
                    raise ValueError("a history row without prompt or completion_ids: TRL passed none to reward()")
                prompt = tokenizer.apply_chat_template(row["prompt"], tools=tools or None,
                                                       add_generation_prompt=True, tokenize=True, return_dict=True)
                p_ids, c_ids = list(prompt["input_ids"]), row["completion_ids"]
                mask = torch.tensor(sampled_mask(tokenizer, c_ids, markers), dtype=torch.float32, device=device)
                if not c_ids or not mask.sum():
                    out.append(0.0)
                    continue
                ids = torch.tensor([p_ids + c_ids], device=device)
                logits = model(ids).logits[0, len(p_ids) - 1:-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(p_ids):, None])[:, 0]
                out.append(float((lp * mask).sum() / mask.sum()))
        inst._episode.close()
        return out


def turn_markers(tokenizer: Any) -> tuple[int, list[int]]:
    """The end-of-turn token id and the assistant header ids with which the tokenizer's chat template
    closes and opens an assistant turn (what :func:`sampled_mask` splits a completion at)."""
    probe = [{"role": "user", "content": "x"}]
    with_header = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=True, return_dict=True)
    without = tokenizer.apply_chat_template(probe, add_generation_prompt=False, tokenize=True, return_dict=True)
    header = list(with_header["input_ids"])[len(without["input_ids"]):]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    end = im_end if isinstance(im_end, int) and im_end != tokenizer.unk_token_id else tokenizer.eos_token_id
    return end, header


def sampled_mask(tokenizer: Any, completion_ids: list[int], markers: tuple[int, list[int]] | None = None) -> list[int]:
    """1 for each token of a TRL completion that the model sampled, 0 for the tool results TRL appended:
    an assistant turn runs to its end-of-turn token, and the next one starts after the assistant header
    the chat template opens a turn with (``markers``: :func:`turn_markers`, read off the template when
    not given)."""
    end, header = markers if markers is not None else turn_markers(tokenizer)
    mask, sampled, i = [], True, 0
    while i < len(completion_ids):
        if sampled:
            mask.append(1)
            sampled = completion_ids[i] != end
            i += 1
        elif header and completion_ids[i:i + len(header)] == header:
            mask += [0] * len(header)
            sampled, i = True, i + len(header)
        else:
            mask.append(0)
            i += 1
    return mask


def parse_response(tokenizer: Any, response: Any, schema: Any = None, *, prefix: Any = None,
                   tools: Any = None) -> Any:
    """``tokenizer.parse_response`` through envfactory's parser (see :func:`prepare_tokenizer`)."""
    if isinstance(response, str):
        text = response
    elif hasattr(response, "tolist"):
        response = response.tolist()
        if response and isinstance(response[0], list):
            return [parse_response(tokenizer, r, prefix=prefix, tools=tools) for r in response]
        text = tokenizer.decode(response, skip_special_tokens=False)
    elif isinstance(response, (list, tuple)) and response and isinstance(response[0], (list, str)):
        return [parse_response(tokenizer, r, prefix=prefix, tools=tools) for r in response]
    else:
        text = tokenizer.decode(list(response), skip_special_tokens=False)
    for marker in (*_END_MARKERS, tokenizer.eos_token or "", tokenizer.pad_token or ""):
        if marker:
            text = text.split(marker)[0] if marker in text else text
    parsed = parse_text(text)
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if parsed.calls and not parsed.errors:
        msg["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                             for c in parsed.calls]
    return msg


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give ``tokenizer`` envfactory's tool-call parsing for TRL (in place; returned for chaining).

    TRL calls ``tokenizer.parse_response(ids, prefix=..., tools=...)`` when the tokenizer has a
    ``response_template``. This sets a Hermes one (what TRL uses for Qwen models; it is what a saved
    tokenizer keeps) and routes the instance's ``parse_response`` to :func:`parse_response`, so a
    completion's calls are the ones ``envfactory.make`` would parse from the same text. A completion
    with a malformed call carries no ``tool_calls``: the rollout ends, and its text goes to the episode,
    which counts it as a parse error, as ``make`` does."""
    from trl.chat_template_utils import qwen3_template

    if getattr(tokenizer, "response_template", None) is None:
        tokenizer.response_template = qwen3_template
    tokenizer.parse_response = types.MethodType(parse_response, tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer
