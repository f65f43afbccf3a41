"""``envfactory export NAME --openenv DIR``: an environment as an OpenEnv Space.

Writes the layout that ``openenv`` (0.10) validates and pushes to the Hugging Face Hub
(``openenv validate DIR``, ``openenv push DIR``):

* ``openenv.yaml``: the manifest (``type: space``, ``runtime: fastapi``, ``app: server.app:app``,
  port 8000; its ``validation`` section declares the reward range [0, 1], the tools and the task
  counts of the served split);
* ``Dockerfile`` (at the root, where a Space wants it): ``python:3.11-slim``, ``pip install`` of the
  bundled envfactory source and ``openenv>=0.10,<0.11``, then ``python -m server.app``;
* ``server/app.py``: the entry point: ``app`` is :func:`envfactory.faces.openenv_server.build_app`
  for NAME (what ``envfactory serve NAME --protocol openenv`` serves), ``main()`` serves it
  (``--host``, ``--port``) with the same limits;
* ``pyproject.toml`` (``[project.scripts] server = "server.app:main"``, for ``uv run server``),
  ``client.py`` / ``models.py`` / ``__init__.py`` (envfactory's typed client and wire types), a
  ``README.md`` with the Space's front matter;
* ``envfactory_src/``: envfactory itself (its ``envfactory``, ``environments`` and ``tools``
  packages and its ``pyproject.toml``), which the image installs: envfactory is not on PyPI.

The Space listens on all interfaces; with the Space secret ``ENVFACTORY_TOKEN`` set every request
must carry it (``Authorization: Bearer``), without it the Space is open to anyone who can reach it,
as OpenEnv Spaces are. Only environments of envfactory's own packages are exported (one defined in
another module would be missing from the image: refused, named).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["export_openenv_space", "SPACE_PACKAGES", "OPENENV_REQUIREMENT"]

SPACE_PACKAGES = ("envfactory", "environments", "tools")  # what the image needs of this project
OPENENV_REQUIREMENT = "openenv>=0.10,<0.11"
PORT = 8000


def _yaml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _manifest(spec: Any, split: str, counts: dict[str, int]) -> str:
    tools = list(spec.tools_of())
    count_lines = "".join(f"      {json.dumps(k)}: {v}\n" for k, v in counts.items())
    tags = ["envfactory", "tool-use", str(spec.domain or "tools")]
    return f"""# OpenEnv manifest of {spec.name}, written by `envfactory export {spec.name} --openenv DIR`
spec_version: 1
name: {spec.name}
version: 0.1.0
type: space
runtime: fastapi
app: server.app:app
port: {PORT}
validation:
  reward:
    range: [0.0, 1.0]
    oracle_tolerance: 0.0
    floor_margin: 0.1
  resources:
    cpu: 1.0
    memory_mb: 1024
    disk_mb: 1024
    episode_timeout_s: 300.0
  capabilities:
    verifier:
      kind: reward_channel
    task_api: true
    declared_tools: {_yaml_list(tools)}
    declared_task_count:
{count_lines}  types:
    tags: {_yaml_list(tags)}
"""


_APP = '''"""The OpenEnv server of {name}: envfactory's (``envfactory serve {name} --protocol openenv``).

Written by ``envfactory export {name} --openenv DIR``. ``app`` serves the {split!r} split on all
interfaces; the secret ``ENVFACTORY_TOKEN`` (a Space secret), when set, is required on every request.

    python -m server.app [--host 0.0.0.0] [--port {port}]
"""

from envfactory.faces.openenv_server import build_app, serve_openenv
from envfactory.faces.guard import resolve_token

NAME = {name!r}
SPLIT = {split!r}

# local_only=False: a Space is reached through a proxy under its own host name
app = build_app(NAME, split=SPLIT, token=resolve_token(None), local_only=False)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=f"serve {{NAME}} over OpenEnv")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default={port})
    args = parser.parse_args()
    # a Space is public by design: without ENVFACTORY_TOKEN it serves without one
    serve_openenv(NAME, args.host, args.port, app=app, token=resolve_token(None), allow_no_token=True)


if __name__ == "__main__":
    main()
'''

_DOCKERFILE = """# The OpenEnv Space of {name}, written by `envfactory export {name} --openenv DIR`
FROM python:3.11-slim

WORKDIR /app/env
COPY . /app/env
RUN pip install --no-cache-dir ./envfactory_src "{openenv}"

ENV PYTHONUNBUFFERED=1
EXPOSE {port}
HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \\
    CMD python -c "import urllib.request; urllib.request.urlopen('http://localhost:{port}/health')" || exit 1

CMD ["python", "-m", "server.app", "--host", "0.0.0.0", "--port", "{port}"]
"""

_PYPROJECT = """[build-system]
requires = ["setuptools>=68", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "openenv-{slug}"
version = "0.1.0"
description = "{name} (envfactory) as an OpenEnv environment"
requires-python = ">=3.11"
dependencies = ["{openenv}", "envfactory"]

[project.scripts]
server = "server.app:main"

[tool.uv.sources]
envfactory = {{ path = "envfactory_src" }}

[tool.setuptools]
packages = ["server"]
"""

_CLIENT = '''"""The client of {name}'s OpenEnv server: envfactory's typed client (any OpenEnv client plays it:
``GenericEnvClient`` with plain dicts, ``MCPToolClient`` with its tools)."""

from envfactory.faces.openenv_client import EnvfactoryClient

__all__ = ["EnvfactoryClient"]
'''

_MODELS = '''"""The wire types of {name}'s OpenEnv server (envfactory's)."""

from envfactory.faces.openenv_types import EnvfactoryAction, EnvfactoryObservation

__all__ = ["EnvfactoryAction", "EnvfactoryObservation"]
'''

_INIT = '''"""{name} (envfactory) as an OpenEnv environment: ``from client import EnvfactoryClient``."""
'''

_README = """---
title: {name}
emoji: 🧰
colorFrom: blue
colorTo: indigo
sdk: docker
pinned: false
app_port: {port}
tags:
  - openenv
  - envfactory
---

# {name}

{description}

An envfactory environment served over OpenEnv: the server of `envfactory serve {name} --protocol openenv`,
serving the `{split}` split ({count} tasks). Tools: {tools}.

## Play

```python
from openenv.core.generic_client import GenericEnvClient

with GenericEnvClient(base_url="https://YOUR-SPACE.hf.space").sync() as env:
    obs = env.reset(split="{split}", index=0).observation       # the instruction, the tool schemas
    r = env.step({{"text": '<tool_call>{{"name": "...", "arguments": {{}}}}</tool_call>'}})
    r = env.step({{"text": "Done."}})                         # no tool call: the episode ends; r.reward is 1.0 on success
```

`MCPToolClient` plays it one tool call a turn (`list_tools()`, `call_tool(name, **args)`; a tool's
own error is raised); the Task API lists the tasks (`GET /{name}/splits`, `POST /{name}/tasks`).
Reward is sparse: 1.0 when the task succeeded, judged from the final state on the server.

## Run

```bash
docker build -t {slug} . && docker run -p {port}:{port} {slug}
# or, without Docker:  pip install ./envfactory_src "{openenv}" && python -m server.app --port {port}
```

Set the secret `ENVFACTORY_TOKEN` (a Space secret) to require a token on every request
(`Authorization: Bearer TOKEN`); without it the server answers anyone who can reach it.
"""


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _project_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not all((root / p).is_dir() for p in SPACE_PACKAGES):
        raise FileNotFoundError(
            f"exporting an OpenEnv Space bundles envfactory's source, and {root} is not its checkout (no "
            f"pyproject.toml or no {'/'.join(SPACE_PACKAGES)} next to the envfactory package); install it with "
            "`pip install -e <checkout>`")
    return root


def _copy_source(root: Path, dest: Path) -> int:
    """envfactory's source (``SPACE_PACKAGES``, ``pyproject.toml``, ``README.md``) into ``dest``; the
    number of files."""
    n = 0
    for rel in ("pyproject.toml", "README.md", "LICENSE"):
        if (root / rel).is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, dest / rel)
            n += 1
    for pkg in SPACE_PACKAGES:
        for p in sorted((root / pkg).rglob("*")):
            if not p.is_file() or "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo"):
                continue
            out = dest / p.relative_to(root)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, out)
            n += 1
    return n


def export_openenv_space(name: str, dest: str | Path, *, split: str = "train", force: bool = False) -> dict[str, Any]:
    """Write the OpenEnv Space of ``name`` into ``dest`` (see the module's docstring).

    ``split``: the tasks the Space serves (default ``train``; ``all`` or ``eval`` for an evaluation
    Space). ``dest`` must not exist or be empty, unless ``force`` (then the files written here are
    replaced, others left). Raises ``KeyError`` (an unknown environment), ``ValueError`` (a team
    environment, an environment outside envfactory's packages, an unknown or empty split, a
    non-empty ``dest``), ``FileNotFoundError`` (no source checkout to bundle). Returns what was
    written: ``{"name", "dir", "split", "files", "tasks", "tools"}``.
    """
    from ..definition import split_members
    from ..registry import spec as get_spec

    spec = get_spec(name)
    if spec.multi_agent:
        raise ValueError(f"{spec.name} is a team environment; an OpenEnv Space plays single-agent environments "
                         "(one OpenEnv session is one agent)")
    module = (spec.module or "").split(".")[0]
    if module not in SPACE_PACKAGES:
        raise ValueError(f"{spec.name} is defined in module {spec.module!r}, outside envfactory's packages "
                         f"({', '.join(SPACE_PACKAGES)}); the Space bundles only those, so it would not find "
                         "the environment: move it into environments/ to export it")
    members = split_members(split)  # ValueError: an unknown split
    served = spec.tasks_in(split)  # split_members checked the name
    if not served:
        raise ValueError(f"{spec.name} has no task in the {split!r} split; choose another (--split all)")
    root = _project_root()
    out = Path(dest)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} is not empty; name a new directory, or pass --force to write over it")
    counts = {split: len(served)}
    for m in members:
        if m != split:
            counts[m] = len(spec.tasks_in(m))
    slug = _slug(spec.name)
    src = out / "envfactory_src"
    if src.exists():
        shutil.rmtree(src)
    files = _copy_source(root, src)
    fmt = dict(name=spec.name, split=split, port=PORT, slug=slug, openenv=OPENENV_REQUIREMENT)
    texts = {
        "openenv.yaml": _manifest(spec, split, counts),
        "Dockerfile": _DOCKERFILE.format(**fmt),
        "pyproject.toml": _PYPROJECT.format(**fmt),
        "README.md": _README.format(**fmt, count=len(served), description=(spec.description or "").strip()
                                    or f"A {spec.domain} tool-use environment.",
                                    tools=", ".join(f"`{t}`" for t in spec.tools_of())),
        "__init__.py": _INIT.format(**fmt),
        "client.py": _CLIENT.format(**fmt),
        "models.py": _MODELS.format(**fmt),
        "server/__init__.py": "",
        "server/app.py": _APP.format(**fmt),
        ".dockerignore": "__pycache__\n*.pyc\n.venv\n",
        "outputs/.gitkeep": "",  # openenv's recommended layout has it
    }
    for rel, text in texts.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {"name": spec.name, "dir": str(out), "split": split, "files": sorted(texts) + [f"envfactory_src/ ({files} files)"],
            "tasks": counts, "tools": list(spec.tools_of())}
