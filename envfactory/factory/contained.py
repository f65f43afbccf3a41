"""Generated environment modules, contained: their code runs only in containers, never on the host.

An LLM-written module (:mod:`.from_prompt`) is untrusted code. This module lets the
host register and play it without ever importing it:

1. **Image.** :func:`module_image` builds (offline, cached by content) a thin image
   on top of the envfactory image (:func:`envfactory.runtime.images.image_for` with no extra
   modules): the module's verified bytes and a two-line *boot* module that imports it
   and registers its ``SPEC``, both in ``/opt/envf-extra`` (on the image's
   ``PYTHONPATH``), as the Docker runtime ships extra modules.
2. **Manifest.** The *judge container* (a hardened server container of that image,
   :class:`Judge`) answers the ``manifest`` op (:func:`manifest_of`, run in there):
   everything the host needs as plain JSON (name, domain, description, the rendered
   system prompt, the tools' schemas with ``read_only``, the state's field names, and
   each task's id, instruction, initial state, reference solution calls, answer facts,
   ``max_turns``, ...). The host checks its shape strictly (:func:`spec_from_manifest`)
   and registers a :class:`ContainedSpec`: a :class:`~envfactory.ToolEnvSpec` whose tools
   are schemas only (their function refuses to run), whose state type
   (:class:`ContainedState`) holds JSON (a JSON object with the state's field names),
   and whose code-valued parts are remote calls to the judge.
3. **Worlds.** ``envfactory.make(name)`` of a :class:`ContainedSpec` builds a
   :class:`~envfactory.runtime.docker.ContainerWorld` on that image (the registry asks
   the spec for its world, :meth:`ContainedSpec.make_world`); ``runtime="local"``
   (or ``"ray"``) is refused with an error that says why.
4. **Judging.** Every part of the referee's work that is code in the module runs in
   the judge container, through ops of :mod:`envfactory.runtime.serve` on a session of its own
   that never holds a world: a task's success on the final state (``judge``: its
   ``check``, or equality with the goal state its reference solution produces, which
   the judge container computes itself), ``terminal`` after a turn, and ``payoff``.
   The host sends the final state as JSON (fetched from the agent's world and
   validated here as a :class:`ContainedState`); the judge validates it into the real
   state type and answers a bool (or rewards), which the host checks for type. Tool
   arguments are validated in the world's container (a call whose arguments JSON
   cannot carry unchanged is refused here as ``invalid_arguments``). Answer facts are
   plain strings, matched on the host as for any environment.

Trust model. *The agent* can influence only its own world's state, through tool
calls the host referee parsed and allowed, run in the world's container. It cannot
reach the judge container (no tool call ever runs there: it only receives the final
state as JSON, re-validated into the real state type), the goal state (computed
there from the reference solution, in a process where no agent call ran), the
manifest (read once, at load time, before any episode), the rules (turns, the end,
answer facts: on the host) or the host process. *The module* (its author) can answer
anything from its containers: the host treats every reply as untrusted data (shape
and types checked; a malformed reply removes the container as untrustworthy), so the
worst a hostile module can do is mis-score its own environment, inside containers
without network, with a read-only root, a non-root user, no capabilities and
memory / CPU / pid limits. A check that raises (or a state the real type refuses)
judges as a failure, with a warning, instead of crashing the host's run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, ValidationError, create_model, model_validator

from envfactory.definition import SOLE_AGENT, ToolEnvSpec
from envfactory.state import State
from envfactory.task import Task, ToolCall
from envfactory.runtime.generated import MANIFEST_FORMAT, ManifestError, boot, find_spec_in, judge_op, manifest_of
from envfactory.tooling import Tool, finish_tool

__all__ = ["ContainedSpec", "ContainedState", "Judge", "ManifestError", "MANIFEST_FORMAT", "boot",
           "find_spec_in", "load_contained", "manifest_of", "module_image", "spec_from_manifest", "judge_op"]

log = logging.getLogger(__name__)

IMAGE_REPO = "envfactory-gen"
RECIPE = 1  # bump when the image recipe below changes
MODULE_PREFIX = "envf_gen_"

_DOCKERFILE = """\
FROM {base}
COPY {module}.py {module}_boot.py /opt/envf-extra/
LABEL org.envfactory.generated="{module}" org.envfactory.sha256="{sha256}"
"""
_BOOT = '''"""Registers the generated environment module {module} (written by envfactory.factory.contained)."""
from envfactory.runtime.generated import boot

boot({module!r})
'''


# -- on the host: the state, the tools and the spec of a contained module ----------------------
def _faithful(v: Any, depth: int = 0) -> str | None:
    """``None`` when JSON carries ``v`` unchanged, else what is not JSON in it."""
    c = v.__class__
    if c is str or c is int or c is float or c is bool or v is None:
        return None
    if depth > 200:
        return "too deeply nested"
    if c is dict:
        for k, x in v.items():
            if k.__class__ is not str:
                return f"a {type(k).__name__} key"
            bad = _faithful(x, depth + 1)
            if bad:
                return bad
        return None
    if c is list:
        for x in v:
            bad = _faithful(x, depth + 1)
            if bad:
                return bad
        return None
    return f"a {type(v).__name__}"


class ContainedState(State):
    """The host's view of a contained module's state: a JSON object whose keys are the real
    state's field names (``envf_fields``; ``envf_required`` present), values any JSON. The
    real type validates it in the containers."""

    model_config = ConfigDict(extra="allow")
    envf_fields: ClassVar[frozenset[str]] = frozenset()
    envf_required: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _json_object(cls, data: Any) -> Any:
        if data.__class__ is not dict:
            raise ValueError(f"a state is a JSON object, not {type(data).__name__}")
        unknown = [k for k in data if k not in cls.envf_fields]
        if unknown:
            raise ValueError(f"unknown state fields {sorted(map(str, unknown))[:10]}; "
                             f"the fields are {sorted(cls.envf_fields)}")
        missing = cls.envf_required - data.keys()
        if missing:
            raise ValueError(f"missing state fields {sorted(missing)}")
        bad = _faithful(data)
        if bad:
            raise ValueError(f"a state holds plain JSON only, not {bad}")
        return data


def _contained_only(state: Any, **arguments: Any) -> Any:
    raise RuntimeError("this tool belongs to a generated module: it runs only in the module's container "
                       "(envfactory.make(name) runs it on the docker runtime)")


class _JsonArgs:
    """A contained tool's arguments model on the host: any JSON object, refused otherwise
    (the real model validates them in the container)."""

    @staticmethod
    def build(name: str) -> Any:
        def plain(cls: Any, data: Any) -> Any:
            if data.__class__ is dict:
                bad = _faithful(data)
                if bad:
                    raise ValueError(f"arguments of a generated module's tool are plain JSON (the container "
                                     f"validates them), not {bad}")
            return data

        return create_model(f"{name}_json_args", __config__=ConfigDict(extra="allow"),
                            # pydantic's stubs want a bare function; it takes the classmethod alike
                            __validators__={"_plain": model_validator(mode="before")(  # type: ignore[dict-item]
                                classmethod(plain))})  # type: ignore[arg-type]


def _proxy_tool(doc: dict[str, Any]) -> Tool:
    params = doc["parameters"]
    props = params.get("properties")
    return Tool(name=doc["name"], description=doc["description"], fn=_contained_only, parameters=params,
                args_model=_JsonArgs.build(doc["name"]), read_only=doc["read_only"],
                _arg_names=tuple(props) if isinstance(props, dict) else ())


class _JudgedCheck:
    """A task's ``check`` on the host: asks the judge container (see the module docstring)."""

    __slots__ = ("judge", "task_id")

    def __init__(self, judge: "Judge", task_id: str) -> None:
        self.judge, self.task_id = judge, task_id

    def __call__(self, state: Any) -> bool:
        return self.judge.state_ok(self.task_id, _state_doc(state))

    def __repr__(self) -> str:
        return f"<judged in the container: task {self.task_id}>"


class _JudgedTerminal:
    __slots__ = ("judge",)

    def __init__(self, judge: "Judge") -> None:
        self.judge = judge

    def __call__(self, state: Any) -> bool:
        return self.judge.terminal(_state_doc(state))


class _JudgedPayoff:
    __slots__ = ("judge",)

    def __init__(self, judge: "Judge") -> None:
        self.judge = judge

    def __call__(self, task: Task, state: Any, success: bool) -> dict[str, float]:
        return self.judge.payoff(task.id, _state_doc(state), bool(success))


def _state_doc(state: Any) -> Any:
    from envfactory.runtime.wire import state_json

    return state_json(state) if isinstance(state, State) else state


class ContainedSpec(ToolEnvSpec):
    """The registered spec of a generated module (see the module docstring): built from its
    manifest by :func:`spec_from_manifest`; its tools, checks, ``terminal`` and ``payoff``
    run only in containers.

    Attributes (besides ToolEnvSpec's):
        image: The module's image (:func:`module_image`).
        judge: Its :class:`Judge`.
        manifest: The manifest it was built from.
    """

    image: str
    judge: "Judge"
    manifest: dict[str, Any]

    def get_tasks(self) -> list[Task]:
        """The manifest's tasks (replayed in the container, never here)."""
        if self._tasks is None:
            tasks = list(self.tasks)  # type: ignore[arg-type]
            self._task_index = {t.id: t for t in tasks}
            self._tasks = tasks
        return self._tasks

    def make_world(self, runtime: str | None = None, **options: Any) -> Any:
        """The world of an episode (``envfactory.make`` asks the spec): a
        :class:`~envfactory.runtime.docker.ContainerWorld` on the module's image."""
        if runtime not in (None, "docker"):
            raise ValueError(
                f"{self.name} is a generated module: its code runs only in containers, never in this "
                f"process, so it runs on the docker runtime only (runtime={runtime!r} was asked); use "
                f"envfactory.make({self.name!r}) or runtime='docker'")
        from envfactory.runtime.docker import ContainerWorld

        options.setdefault("image", self.image)
        return ContainerWorld(self, **options)

    def close(self) -> None:
        """Release the judge container (a later judgement starts a new one)."""
        self.judge.close()


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _need(cond: Any, what: str) -> None:
    if not cond:
        raise ManifestError(f"malformed manifest: {what}")


def _is_str_list(v: Any) -> bool:
    return v.__class__ is list and all(x.__class__ is str for x in v)


def _checked_manifest(m: Any, name: str) -> dict[str, Any]:
    """``m`` if it has the manifest's shape (types, known keys, ids unique), else :class:`ManifestError`."""
    _need(m.__class__ is dict, "not a JSON object")
    _need(m.get("format") == MANIFEST_FORMAT, f"format {m.get('format')!r}, expected {MANIFEST_FORMAT}")
    _need(m.get("name") == name, f"the module's environment is {m.get('name')!r}, its provenance says {name!r}")
    for k in ("domain", "description", "system_prompt"):
        _need(m.get(k).__class__ is str, f"{k} is not a string")
    mt = m.get("max_turns")
    _need(mt.__class__ is int and 1 <= mt <= 1_000_000, "max_turns is not a positive int")
    for k in ("finish_tool", "terminal", "payoff"):
        _need(m.get(k).__class__ is bool, f"{k} is not a bool")
    _need(m.get("isolation") in ("session", "container"), "isolation is not 'session' or 'container'")
    st = m.get("state")
    _need(st.__class__ is dict and st.get("type").__class__ is str and _is_str_list(st.get("fields"))
          and _is_str_list(st.get("required")) and set(st["required"]) <= set(st["fields"]),
          "state is not {type, fields, required}")
    tools = m.get("tools")
    _need(tools.__class__ is list, "tools is not a list")
    names: set[str] = set()
    for t in tools:
        _need(t.__class__ is dict and t.get("name").__class__ is str and t["name"]
              and t.get("description").__class__ is str and t.get("parameters").__class__ is dict
              and t.get("read_only").__class__ is bool, f"a tool is not {{name, description, parameters, read_only}}: "
              f"{str(t)[:200]}")
        _need(_TOOL_NAME.match(t["name"]), f"tool name {t['name'][:80]!r} is not [a-zA-Z0-9_-]{{1,64}}")
        _need(t["name"] not in names, f"two tools are named {t['name']!r}")
        names.add(t["name"])
    tasks = m.get("tasks")
    _need(tasks.__class__ is list and tasks, "tasks is not a non-empty list")
    ids: set[str] = set()
    callable_names = names | ({finish_tool.name} if m["finish_tool"] else set())
    for t in tasks:
        _need(t.__class__ is dict, "a task is not an object")
        tid = t.get("id")
        _need(tid.__class__ is str and tid and tid not in ids, f"task id {tid!r} is not a unique string")
        ids.add(tid)
        _need(t.get("instruction").__class__ is str, f"task {tid}: instruction is not a string")
        _need(t.get("initial_state").__class__ is dict, f"task {tid}: initial_state is not an object")
        sol = t.get("solution")
        _need(sol.__class__ is list, f"task {tid}: solution is not a list")
        for c in sol:
            _need(c.__class__ is dict and c.get("name") in callable_names and c.get("arguments").__class__ is dict
                  and c.get("agent") in (None, SOLE_AGENT) and set(c) <= {"name", "arguments", "id", "agent"}
                  and c.get("id").__class__ in (str, type(None)),
                  f"task {tid}: a solution call is not {{name (a tool), arguments}}: {str(c)[:200]}")
        _need(t.get("private").__class__ is dict and all(v.__class__ is str for v in t["private"].values()),
              f"task {tid}: private is not an object of strings")
        _need(_is_str_list(t.get("answer_facts")), f"task {tid}: answer_facts is not a list of strings")
        _need(t.get("answer_rivals") is None or _is_str_list(t["answer_rivals"]),
              f"task {tid}: answer_rivals is not a list of strings")
        _need(t.get("answer_seen").__class__ is bool, f"task {tid}: answer_seen is not a bool")
        _need(t.get("difficulty") is None or t["difficulty"].__class__ is int, f"task {tid}: difficulty is not an int")
        _need(t.get("metadata").__class__ is dict, f"task {tid}: metadata is not an object")
        _need(t.get("success") in ("check", "goal_state"), f"task {tid}: success is not 'check' or 'goal_state'")
    _need(m.get("replay_errors").__class__ is dict, "replay_errors is not an object")
    return m





def _literal(text: str) -> str:
    """``text`` as a format template that renders to itself (the host formats system prompts)."""
    return text.replace("{", "{{").replace("}", "}}")


def spec_from_manifest(manifest: Any, *, name: str, image: str, judge: "Judge", module: str) -> ContainedSpec:
    """The host's :class:`ContainedSpec` of a checked manifest (:class:`ManifestError` if malformed)."""
    m = _checked_manifest(manifest, name)
    st = m["state"]
    state_type: type[ContainedState] = type(st["type"] if _IDENT.match(st["type"]) else "GeneratedState", (ContainedState,),
                      {"__module__": __name__, "envf_fields": frozenset(st["fields"]),
                       "envf_required": frozenset(st["required"]),
                       "__doc__": f"The state of {name} as JSON (the real type lives in its container)."})
    try:
        tools = [_proxy_tool(t) for t in m["tools"]]
        tasks = [Task(id=t["id"], instruction=t["instruction"],
                      initial_state=state_type.model_validate(t["initial_state"]),
                      solution=[ToolCall(c["name"], c["arguments"], c.get("id"), c.get("agent")) for c in t["solution"]],
                      private=t["private"], answer_facts=t["answer_facts"], answer_rivals=t["answer_rivals"],
                      answer_seen=t["answer_seen"], difficulty=t["difficulty"], metadata=t["metadata"],
                      check=_JudgedCheck(judge, t["id"]))
                 for t in m["tasks"]]
        spec = ContainedSpec(
            name=m["name"], domain=m["domain"], state_type=state_type, tools=tools, tasks=tasks,
            description=m["description"], system_prompt=_literal(m["system_prompt"]) or None,
            max_turns=m["max_turns"], finish_tool=m["finish_tool"],
            terminal=_JudgedTerminal(judge) if m["terminal"] else None,
            payoff=_JudgedPayoff(judge) if m["payoff"] else None,
            isolation=m["isolation"], module=module,
            metadata={"contained": {"image": image, "module": module}},
        )
    except ManifestError:
        raise
    except (ValidationError, ValueError, TypeError) as exc:
        raise ManifestError(f"malformed manifest: {type(exc).__name__}: {str(exc)[:1000]}") from None
    spec.image, spec.judge, spec.manifest = image, judge, m
    spec.replay_errors.update(m["replay_errors"])
    return spec


# -- on the host: images, the judge container, loading ------------------------------------------
def _client() -> Any:
    from envfactory.runtime.pool import docker_client

    try:
        return docker_client()
    except RuntimeError as exc:
        raise RuntimeError(f"generated modules run only in containers (they are never imported on this "
                           f"host), and {exc}") from None


def module_image(code: str, module: str, *, client: Any = None) -> str:
    """The image that serves generated module ``module`` (its source ``code``): the envfactory
    image plus the module and its boot module; built once per content, offline."""
    import docker

    from envfactory.runtime.images import ImageError, image_for

    client = client or _client()
    base = image_for([], client=client)[0]
    boot_code = _BOOT.format(module=module)
    sha = hashlib.sha256(code.encode()).hexdigest()
    digest = hashlib.sha256(f"recipe={RECIPE}\nbase={base}\nmodule={module}\n".encode() + boot_code.encode()
                            + b"\0" + code.encode()).hexdigest()[:16]
    tag = f"{IMAGE_REPO}:{digest}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    ctx = Path(tempfile.mkdtemp(prefix="envf-gen-ctx-"))
    try:
        (ctx / f"{module}.py").write_bytes(code.encode())
        (ctx / f"{module}_boot.py").write_text(boot_code)
        for p in ctx.iterdir():
            p.chmod(0o644)
        (ctx / "Dockerfile").write_text(_DOCKERFILE.format(base=base, module=module, sha256=sha))
        try:
            client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="none")
        except docker.errors.BuildError as exc:
            out = "".join(str(c.get("stream", c.get("error", ""))) for c in exc.build_log)
            raise ImageError(f"docker build of {tag} failed: {exc}\n{out[-3000:]}") from None
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return tag


class Judge:
    """The judge container of one generated environment: a server container of its image,
    holding one session that never starts a world; it answers the manifest and judges final
    states (see the module docstring). Thread-safe (one request at a time); started on first
    use, and again after :meth:`close` or when its container died.

    Args:
        name: The environment's name.
        module: The boot module that registers it in the container.
        image: The module's image.
        timeout: Seconds one request may take.
        limits: The container's :class:`~envfactory.runtime.container.Limits`.
    """

    def __init__(self, name: str, module: str, image: str, *, timeout: float = 30.0, limits: Any = None) -> None:
        # what the container is started for: only its name and module are used there
        self._boot = ToolEnvSpec(name=name, domain="generated", state_type=ContainedState, tools=[], tasks=[],
                                 finish_tool=False, module=module)
        self.name, self.image, self.timeout, self.limits = name, image, timeout, limits
        self._pool: Any = None
        self._link: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.requests = 0

    def _ensure(self) -> Any:
        from envfactory.runtime.docker_session import SessionLink
        from envfactory.runtime.pool import Pool

        if self._pool is None or self._pool._closed:
            self._pool = Pool(self._boot, self.image, warm=0, sessions_per_container=4,
                              **({"limits": self.limits} if self.limits is not None else {}))
            self._link = SessionLink(self._pool, self.name, self.timeout)
        self._link.ensure()
        return self._link

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """One judge op; once more on a fresh container when its container died mid-request."""
        from envfactory.runtime.docker_session import ContainerDied

        if self._pid != os.getpid():  # a forked child: the parent's container, channel and lock are not its own
            self._pid, self._pool, self._link, self._lock = os.getpid(), None, None, threading.Lock()
        with self._lock:
            for attempt in (0, 1):
                link = self._ensure()
                try:
                    reply = link.request(req)
                    break
                except ContainerDied:
                    if attempt:
                        raise
            self.requests += 1
            return reply

    def _untrustworthy(self, what: str) -> Exception:
        with self._lock:
            if self._link is not None:
                return self._link.untrustworthy(what)
        from envfactory.runtime.container import ContainerError

        return ContainerError(f"{self.name}: the judge container is untrustworthy: {what}")

    def _warn(self, reply: dict[str, Any], what: str) -> None:
        err = reply.get("error")
        if err is not None:
            log.warning("%s: %s judged as a failure in the container: %s", self.name, what, str(err)[:500])

    def manifest(self) -> dict[str, Any]:
        doc = self.request({"op": "manifest"}).get("manifest")
        if doc.__class__ is not dict:
            raise self._untrustworthy(f"its manifest is a {type(doc).__name__}, not an object")
        return doc

    def state_ok(self, task_id: str, state: Any) -> bool:
        reply = self.request({"op": "judge", "task": task_id, "state": state})
        ok = reply.get("state_ok")
        if ok.__class__ is not bool:
            raise self._untrustworthy(f"its judgement of task {task_id} is {ok!r}, not a bool")
        self._warn(reply, f"task {task_id}")
        return ok

    def terminal(self, state: Any) -> bool:
        reply = self.request({"op": "terminal", "state": state})
        done = reply.get("terminal")
        if done.__class__ is not bool:
            raise self._untrustworthy(f"its terminal() answer is {done!r}, not a bool")
        self._warn(reply, "terminal()")
        return done

    def payoff(self, task_id: str, state: Any, success: bool) -> dict[str, float]:
        reply = self.request({"op": "payoff", "task": task_id, "state": state, "success": success})
        rewards = reply.get("rewards")
        if (rewards.__class__ is not dict or set(rewards) != {SOLE_AGENT}
                or not all(v.__class__ in (int, float) and v.__class__ is not bool for v in rewards.values())):
            raise self._untrustworthy(f"its payoff is {str(rewards)[:200]}, not {{{SOLE_AGENT!r}: number}}")
        self._warn(reply, f"the payoff of task {task_id}")
        return {k: float(v) for k, v in rewards.items()}

    @property
    def container(self) -> Any:
        """The judge's container now (``None`` before its first request)."""
        return self._link.container if self._link is not None else None

    def close(self) -> None:
        with self._lock:
            if self._link is not None:
                self._link.drop()
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = self._link = None


def module_name_for(stem: str, code: str) -> str:
    """The generated module's name in its image (unique per content)."""
    safe = re.sub(r"[^a-z0-9_]", "_", stem.lower())[:40]
    return f"{MODULE_PREFIX}{safe}_{hashlib.sha256(code.encode()).hexdigest()[:12]}"


def load_contained(code: str, *, name: str, stem: str, judge_timeout: float = 30.0) -> ContainedSpec:
    """The :class:`ContainedSpec` of a generated module's verified source ``code`` (its
    environment called ``name``): its image built, its manifest read from its judge container."""
    module = module_name_for(stem, code)
    client = _client()
    image = module_image(code, module, client=client)
    judge = Judge(name, module + "_boot", image, timeout=judge_timeout)
    try:
        manifest = judge.manifest()
        return spec_from_manifest(manifest, name=name, image=image, judge=judge, module=module + "_boot")
    except BaseException:
        judge.close()
        raise
