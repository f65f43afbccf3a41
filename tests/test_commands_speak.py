"""Commands that speak early and small surprises (issue 62): ``play`` prints each episode as it ends,
a cold ``list`` shows progress before it builds anything, ``serve`` over stdio says what it serves,
the Text spaces have a short repr, FindLight-v0..v3 are four environments to Gymnasium (no "out of
date" warning), and the ``smol`` and ``docker`` extras declare what their code imports."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tomllib
import warnings
from importlib import metadata
from pathlib import Path

import gymnasium
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import envfactory
from envfactory import cli

ROOT = Path(__file__).resolve().parents[1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_play_prints_each_episode_before_verifying(monkeypatch, capsys):
    """The first episode is on stdout before the verification starts (it used to verify every
    environment first and print everything at the end)."""
    from envfactory.checks import verify

    seen_when_verifying: list[str] = []
    real = verify.verify_many

    def spy(*args, **kwargs):
        seen_when_verifying.append(capsys.readouterr().out)
        return real(*args, **kwargs)

    monkeypatch.setattr(verify, "verify_many", spy)
    assert cli.main(["play", "--only", "Counter-v0", "--episodes", "1"]) == 0
    (before,) = seen_when_verifying
    assert before.startswith("== episodes") and "Counter-v0" in before and "reward=1" in before
    after = capsys.readouterr().out
    assert "== verification" in after and "1/1 environments verified" in after


def test_play_json_is_one_document(capsys):
    import json

    assert cli.main(["play", "--only", "Counter-v0", "--episodes", "1", "--no-verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["oracle_success"] == 1.0 and {p["agent"] for p in doc["episodes"]} == {"oracle", "random"}


def test_a_cold_list_shows_progress_before_building(monkeypatch, tmp_path, capsys):
    """A cold ``envfactory list`` draws its bar (on a terminal's stderr) before the first entry is
    built, and advances it per environment."""
    from envfactory import registry

    names = ["Library-v0", "Bank-v0", "Hotel-v0"]
    monkeypatch.setenv("ENVFACTORY_CACHE", str(tmp_path))
    monkeypatch.setenv("ENVFACTORY_LIST_WORKERS", "1")
    monkeypatch.setattr(registry, "names", lambda: list(names))
    for name in names:  # built by an earlier test of this process: described afresh all the same
        built = registry._REGISTRY.get(name)
        if built is not None:
            monkeypatch.setattr(built, "_tasks", None)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    shown_at_first_build: list[str] = []
    real = registry._describe_one

    def spy(name):
        if not shown_at_first_build:
            shown_at_first_build.append(terminal.getvalue())
        return real(name)

    monkeypatch.setattr(registry, "_describe_one", spy)
    assert cli.main(["list"]) == 0
    first = shown_at_first_build[0]
    total = re.search(r"list: describing:.* 0/(\d+) ", first)  # (fewer than 3 where a test built one here)
    assert total, first
    assert f"{total[1]}/{total[1]}" in terminal.getvalue()
    out = capsys.readouterr().out
    assert all(n in out for n in names)
    terminal.truncate(0)
    assert cli.main(["list"]) == 0  # warm: nothing to build, no bar
    assert "describing" not in terminal.getvalue()


def test_serve_over_stdio_says_what_it_serves():
    pytest.importorskip("mcp")
    r = subprocess.run([sys.executable, "-m", "envfactory.cli", "serve", "Counter-v0"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "serving Counter-v0 over MCP on stdio" in r.stderr and "--protocol openenv" in r.stderr
    assert "serving" not in r.stdout  # stdout is the protocol's


def test_text_spaces_print_short():
    env = gymnasium.make("envfactory/Counter-v0")
    try:
        for space in (env.observation_space, env.action_space):
            text = repr(space)
            assert len(text) < 120 and str(space) == text and "63424 characters" in text, text
    finally:
        env.close()


def test_versions_of_a_name_are_separate_environments_to_gymnasium():
    """FindLight-v0..v3 are four families: making v0 gives no "out of date" warning."""
    envfactory.registry.names()
    for v in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env = gymnasium.make(f"envfactory/FindLight-v{v}")
        assert env.spec is not None and env.spec.id == f"envfactory/FindLight-v{v}"
        env.close()
    assert gymnasium.spec("envfactory/FindLight-v0").id == "envfactory/FindLight-v0"


# -- extras --------------------------------------------------------------------------
def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution that installing ``requirements`` pulls, as far as the installed metadata
    tells (a distribution not installed here contributes its own name only)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or name == "envfactory":
            continue
        seen.add(name)
        try:
            deps = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for d in deps:
            r = Requirement(d)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r)
    return seen


def test_the_smol_extra_compiles_nothing_and_has_what_transformers_needs():
    smol = _extras()["smol"]
    assert "llama-cpp-python" not in _closure(smol)  # a C++ build of many minutes, never used
    names = {canonicalize_name(Requirement(r).name) for r in smol}
    assert {"gguf", "accelerate", "torch", "transformers"} <= names  # from_pretrained(gguf_file=...) needs accelerate


_THIRD_PARTY_IMPORTS = {"agents/models/smol.py": "smol", "envfactory/runtime/images.py": "docker"}


@pytest.mark.parametrize("path, extra", sorted(_THIRD_PARTY_IMPORTS.items()))
def test_an_extra_declares_what_its_code_imports(path, extra):
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    declared = {canonicalize_name(Requirement(r).name) for r in [*project["dependencies"], *_extras()[extra]]}
    dists = metadata.packages_distributions()
    tree = ast.parse((ROOT / path).read_text())
    imported = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.partition(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    own = {"envfactory", "agents", "environments", "tools", "benchmarks"}
    missing = sorted(m for m in imported - own - set(sys.stdlib_module_names)
                     if not {canonicalize_name(d) for d in dists.get(m, [m])} & declared)
    assert not missing, f"{path} imports {missing}, which the '{extra}' extra does not declare"
    if extra == "docker":  # `pip wheel --no-build-isolation` of the project needs the build backend here
        assert {"wheel", "setuptools", "packaging"} <= declared


def test_the_pyproject_keeps_the_other_extras():
    extras = _extras()
    assert {"bfcl", "train", "dev", "bench", "mcp"} <= set(extras)
    assert re.search(r"openenv-core>=0\.3,<0\.4", " ".join(extras["bench"]))
