"""A generated environment module inside its container: importing and registering it (:func:`boot`),
describing it to the host (:func:`manifest_of`) and judging final states for the host (:func:`judge_op`).

The host side (proxy tools, the contained spec, the image of a module) is
:mod:`envfactory.factory.contained`; this half runs in the container, under
:mod:`envfactory.runtime.serve`, and imports nothing of the factory.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from pydantic import ValidationError

from ..definition import SpecError, ToolEnvSpec
from ..tooling import finish_tool

__all__ = ["ManifestError", "MANIFEST_FORMAT", "boot", "find_spec_in", "manifest_of", "judge_op"]

MANIFEST_FORMAT = 1


class ManifestError(SpecError):
    """A generated module's manifest is malformed (or its module has no manifest)."""


def find_spec_in(module: Any) -> ToolEnvSpec:
    """The module's environment: ``SPEC``, or the only :class:`ToolEnvSpec` it defines."""
    found = getattr(module, "SPEC", None)
    if isinstance(found, ToolEnvSpec):
        return found
    specs = [v for v in vars(module).values() if isinstance(v, ToolEnvSpec)]
    if len(specs) != 1:
        raise SpecError(f"the module must define exactly one ToolEnvSpec as SPEC; found {len(specs)} "
                        "ToolEnvSpec objects")
    return specs[0]


def boot(module_name: str) -> ToolEnvSpec:
    """Import the generated module ``module_name`` and register its spec (in the container)."""
    from ..registry import register

    found = find_spec_in(importlib.import_module(module_name))
    found.module = module_name + "_boot"
    return register(found, replace=True)


def _json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"{what} is not plain JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def manifest_of(spec: ToolEnvSpec) -> dict[str, Any]:
    """Everything the host needs of ``spec``, as JSON (run where the module is imported)."""
    from .wire import state_json

    if spec.multi_agent:
        raise ManifestError(f"{spec.name}: a generated module must be a single-agent environment "
                            "(team environments cannot be contained yet)")
    tools = []
    for t in spec.all_tools.values():
        if t is finish_tool:
            continue
        if t.finish:
            raise ManifestError(f"{spec.name}: tool {t.name!r} finishes the episode; only the built-in "
                                "finish tool may (finish_tool=True)")
        tools.append({"name": t.name, "description": t.description, "parameters": _json(t.parameters, f"tool {t.name}'s schema"),
                      "read_only": bool(t.read_only)})
    tasks = []
    for task in spec.get_tasks():
        tasks.append({
            "id": task.id, "instruction": task.instruction,
            "initial_state": _json(state_json(spec.start_state(task)), f"task {task.id}'s initial state"),
            "solution": [_json(c.to_json(), f"task {task.id}'s solution") for c in task.solution],
            "private": dict(task.private), "answer_facts": list(task.answer_facts),
            "answer_rivals": None if task.answer_rivals is None else list(task.answer_rivals),
            "answer_seen": bool(task.answer_seen), "difficulty": task.difficulty,
            "metadata": _json(task.metadata, f"task {task.id}'s metadata"),
            "success": "check" if task.check is not None else "goal_state",
        })
    st = spec.state_type
    fields = list(st.model_fields) + [n for n in st.model_computed_fields if n not in st.model_fields]
    doc = {
        "format": MANIFEST_FORMAT, "name": spec.name, "domain": spec.domain, "description": spec.description,
        "system_prompt": spec.render_system_prompt(), "max_turns": spec.max_turns,
        "finish_tool": bool(spec.finish_tool), "isolation": spec.isolation,
        "state": {"type": st.__name__, "fields": fields,
                  "required": [n for n, f in st.model_fields.items() if f.is_required()]},
        "tools": tools, "tasks": tasks,
        "terminal": spec.terminal is not None, "payoff": spec.payoff is not None,
        "replay_errors": {k: list(v) for k, v in spec.replay_errors.items()},
    }
    return _json(doc, "the manifest")


def judge_op(spec: ToolEnvSpec, req: dict[str, Any]) -> dict[str, Any]:
    """A judge session's op (:mod:`envfactory.runtime.serve` routes them here), in the container:

    * ``{"op": "manifest"}`` -> ``{"manifest": ...}`` (:func:`manifest_of`);
    * ``{"op": "judge", "task", "state"}`` -> ``{"state_ok": bool}``: the task's check, or
      equality with its goal state, on ``state`` validated into the real state type;
    * ``{"op": "terminal", "state"}`` -> ``{"terminal": bool}``;
    * ``{"op": "payoff", "task", "state", "success"}`` -> ``{"rewards": {agent: float}}``.

    Code of the module that raises (or a state the type refuses) answers a failure
    (``false``; rewards of 0) with ``"error"`` saying why, never an error reply.
    """
    op = req.get("op")
    if op == "manifest":
        return {"ok": True, "manifest": manifest_of(spec)}
    task = spec.task(req["task"]) if op in ("judge", "payoff") else None
    try:
        state = spec.state_type.model_validate(req["state"])
    except ValidationError as exc:
        why = f"the state is not a valid {spec.state_type.__name__}: {str(exc)[:1000]}"
        state = None
    if op == "judge":
        if state is not None:
            try:
                assert task is not None  # judge: read above
                return {"ok": True, "state_ok": bool(task.state_ok(state))}
            except Exception as exc:
                why = f"the task's success check raised {type(exc).__name__}: {str(exc)[:1000]}"
        return {"ok": True, "state_ok": False, "error": why}
    if op == "terminal":
        if state is not None:
            try:
                return {"ok": True, "terminal": bool(spec.terminal(state)) if spec.terminal else False}
            except Exception as exc:
                why = f"terminal() raised {type(exc).__name__}: {str(exc)[:1000]}"
        return {"ok": True, "terminal": False, "error": why}
    if op == "payoff":
        success = req.get("success")
        if success.__class__ is not bool:
            raise TypeError("payoff needs success: a bool")
        if state is not None:
            try:
                assert task is not None  # payoff: read above
                return {"ok": True, "rewards": _json(spec.rewards(task, state, success), "the payoff")}
            except Exception as exc:
                why = f"the payoff raised {type(exc).__name__}: {str(exc)[:1000]}"
        return {"ok": True, "rewards": dict.fromkeys(spec.agent_ids, 0.0), "error": why}
    raise ValueError(f"unknown judge op {op!r}")


