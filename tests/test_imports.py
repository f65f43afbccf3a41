"""Imports flow one way (import-linter contracts in pyproject.toml), registration is lazy,
and a missing torch is a failure under CI."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import re
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import require_module

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envfactory", "environments", "tools", "agents", "benchmarks")
_LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    """``lint-imports`` with this interpreter, on the packages under ``cwd`` (no cache files)."""
    require_module("importlinter", "pip install import-linter; scripts/setup.sh installs the dev extra")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-c", _LINT, "--no-cache", "--no-logo", *extra], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _lint_tree(cwd: Path, contracts: tuple[str, ...]) -> subprocess.CompletedProcess:
    return _lint(cwd, *(a for c in contracts for a in ("--contract", c)))


def _copy_tree(dst: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.yaml"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_import_contracts_hold():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and "KEPT" in r.stdout


def test_contracts_catch_a_forbidden_import(tmp_path):
    """The same contracts on a copy of the tree with one forbidden import: the check fails and names it."""
    tree = _copy_tree(tmp_path)
    with open(tree / "envfactory" / "mail.py", "a") as f:
        f.write("\nimport agents.policies.policy  # deliberately forbidden\n")
    r = _lint(tree, "--contract", "core-standalone")
    assert r.returncode != 0, r.stdout
    assert "envfactory.mail -> agents.policies.policy" in r.stdout and "BROKEN" in r.stdout


@pytest.mark.parametrize("module, line, arrow", [
    ("episode.py", "from .faces import gym_env", "envfactory.episode -> envfactory.faces.gym_env"),
    ("runtime/pool.py", "from ..checks import verify", "envfactory.runtime.pool -> envfactory.checks.verify"),
    ("faces/gym_env.py", "from ..factory import from_class", "envfactory.faces.gym_env -> envfactory.factory.from_class"),
])
def test_rooms_contract_catches_an_upward_import(tmp_path, module, line, arrow):
    """Inside envfactory, rooms import downward only (cli -> evaluation -> factory -> checks -> faces
    -> runtime -> the engine at the root): one deliberate upward import and the check fails, naming it."""
    tree = _copy_tree(tmp_path)
    with open(tree / "envfactory" / module, "a") as f:
        f.write(f"\n{line}  # deliberately upward\n")
    r = _lint(tree, "--contract", "rooms")
    assert r.returncode != 0, r.stdout
    assert arrow in r.stdout and "BROKEN" in r.stdout, r.stdout[-3000:]


def test_agents_contract_catches_a_cycle(tmp_path):
    """agents has no import cycles: the random tiny build (agents.models.tiny) never reaches back into its
    pretraining (agents.models.pretrain), which builds on it. A lazy import back closes a cycle and fails."""
    tree = _copy_tree(tmp_path)
    assert _lint(tree, "--contract", "agents-acyclic").returncode == 0
    with open(tree / "agents" / "models" / "tiny.py", "a") as f:
        f.write("\n\ndef _back():\n    from .pretrain import pretrained_tiny_model  # deliberately cyclic\n")
    r = _lint(tree, "--contract", "agents-acyclic")
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-3000:]
    assert ".tiny -> .pretrain" in r.stdout, r.stdout[-3000:]


def test_rooms_hold_at_most_twelve_files_and_no_contract_has_an_exception():
    """A room of ``agents/`` or ``envfactory/factory/`` holds at most 12 modules (a newcomer finds a new
    task kind's file, or a backend's, among a dozen); the import contracts carry no ignored import."""
    for top in (ROOT / "agents", ROOT / "envfactory" / "factory"):
        for room in [top, *(p for p in top.rglob("*") if (p / "__init__.py").is_file())]:
            files = sorted(p.name for p in room.glob("*.py"))
            assert len(files) <= 12, f"{room.relative_to(ROOT)} holds {len(files)} modules: {files}"
    assert "ignore_imports" not in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("module, line, contract, arrow", [
    ("agents/policies/policy.py", "from environments import find_light", "demo-family",
     "agents.policies.policy -> environments.find_light"),
    ("agents/models/tiny.py", "from agents.policies import hf_policy", "agents-rooms",
     "agents.models.tiny -> agents.policies.hf_policy"),
    ("envfactory/factory/tasks/kinds.py", "from envfactory.factory import from_class", "factory-rooms",
     "envfactory.factory.tasks.kinds -> envfactory.factory.from_class"),
    ("envfactory/factory/tasks/success.py", "from envfactory.factory.classes import pystate", "factory-rooms",
     "envfactory.factory.tasks.success -> envfactory.factory.classes.pystate"),
])
def test_room_contracts_catch_an_upward_import(tmp_path, module, line, contract, arrow):
    """Only ``agents.quickstart`` imports a demo family; agents' rooms and the factory's import downward
    (importers -> classes -> tasks): one deliberate upward import fails its contract, naming it."""
    tree = _copy_tree(tmp_path)
    assert _lint(tree, "--contract", contract).returncode == 0
    with open(tree / module, "a") as f:
        f.write(f"\n{line}  # deliberately upward\n")
    r = _lint(tree, "--contract", contract)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-3000:]
    assert arrow in r.stdout, r.stdout[-3000:]


def test_the_engine_sits_alone_at_the_root():
    """envfactory/ holds the engine's modules and the rooms; no benchmark inside the library."""
    root = {p.stem for p in (ROOT / "envfactory").glob("*.py")} - {"__init__"}
    assert root == {"registry", "episode", "world", "users", "mail", "definition", "parsing", "tooling", "task",
                    "conversation", "calls", "state", "env", "snapshots", "quotas", "processes", "sizes"}, root
    rooms = {p.name for p in (ROOT / "envfactory").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {"cli", "faces", "checks", "evaluation", "factory", "runtime"}, rooms
    benchy = [str(p.relative_to(ROOT)) for p in (ROOT / "envfactory").rglob("*.py")
              if "bench" in p.stem or re.search(r"^def bench_", p.read_text(), re.M)]
    assert not benchy, f"benchmarks live in benchmarks/, not in the library: {benchy}"


def test_contracts_catch_a_cycle_inside_the_core(tmp_path):
    """A tiny project under the real configuration: clean it passes; one cycle or one upward
    import and it fails (so the passing check above can fail)."""
    pkgs = {
        "envfactory/__init__.py": "", "envfactory/state.py": "", "envfactory/registry.py": "from . import state\n",
        "envfactory/runtime/__init__.py": "", "envfactory/runtime/docker.py": "from ..registry import x\n",
        "tools/__init__.py": "import envfactory\n", "environments/__init__.py": "import tools\n",
        "agents/__init__.py": "import environments\nimport envfactory.registry\n",
        "benchmarks/__init__.py": "import agents\n",
    }
    for rel, src in pkgs.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(src)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    # every contract but the rooms (whose layers this tiny tree does not have)
    _lint = functools.partial(_lint_tree, contracts=("core-standalone", "no-agents-below", "one-way", "core-acyclic"))
    clean = _lint(tmp_path)
    assert clean.returncode == 0, clean.stdout
    (tmp_path / "envfactory/state.py").write_text("def f():\n    from .runtime import docker\n")  # a cycle
    cyclic = _lint(tmp_path)
    assert cyclic.returncode != 0 and "no import cycles" in cyclic.stdout and "BROKEN" in cyclic.stdout


# -- lazy registration -----------------------------------------------------------
def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_import_envfactory_imports_no_environment_and_no_gymnasium():
    r = _fresh("""
        import sys, envfactory
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("environments", "tools", "agents",
                       "gymnasium", "torch", "transformers"))
        print(heavy)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_gymnasium_ids_work_right_after_import():
    r = _fresh("""
        import sys, envfactory, gymnasium
        ids = [k for k in gymnasium.registry if k.startswith("envfactory/")]
        assert "envfactory/FileSystem-v0" in ids and "envfactory/MultiRecords-v0" not in ids, ids
        assert not any(m.startswith("environments.") for m in sys.modules)  # ids registered, nothing imported
        env = gymnasium.make("envfactory/FileSystem-v0")
        obs, info = env.reset(seed=0)
        assert isinstance(obs, str) and obs
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    # gymnasium imported first, envfactory second: the ids are registered at once
    r = _fresh("""
        import gymnasium, envfactory
        assert "envfactory/Bank-v0" in gymnasium.registry
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_builtin_table_matches_what_the_modules_register():
    import environments
    import envfactory

    table = environments.register_all()
    registered = {s.name: s for s in envfactory.specs()}
    for name, target in table.items():
        module = target if isinstance(target, str) else target["module"]
        assert name in registered, f"{name} is announced in environments/__init__.py but not registered"
        assert registered[name].module == module, (name, registered[name].module, module)
        assert bool(registered[name].multi_agent) == (not isinstance(target, str)), name
    builtin = {n for n, s in registered.items() if (s.module or "").startswith("environments.")}
    assert builtin <= set(table), f"add these to environments/__init__.py: {sorted(builtin - set(table))}"
    modules = {p.stem for p in (ROOT / "environments").glob("*.py") if not p.stem.startswith("_")}
    # a module whose package is not installed here announces nothing (environments.OPTIONAL)
    optional = {m.split(".")[1] for m, (package, _) in environments.OPTIONAL.items()
                if importlib.util.find_spec(package) is None}
    # a spec file's environments are registered by its own module environments.spec_envs.<file>
    announced = {(t if isinstance(t, str) else t["module"]).split(".")[1] for t in table.values()}
    assert modules - optional == announced, f"modules not in the table: {sorted(modules - optional - announced)}"
    for module, (package, names) in environments.OPTIONAL.items():
        installed = importlib.util.find_spec(package) is not None
        assert all((table.get(n) == module) == installed for n in names), (module, package, installed)
    from environments import spec_envs

    files = {spec_envs.module_for(p) for p in spec_envs.files().values()}
    assert files == {m for m in (t if isinstance(t, str) else t["module"] for t in table.values())
                     if m.startswith("environments.spec_envs.")}, "a spec file without environments?"


def test_lazy_table_errors_are_clear(monkeypatch):
    from envfactory import SpecError, registry

    monkeypatch.setattr(registry, "_LAZY", dict(registry._LAZY))
    registry.register_lazy("Ghost-v0", "envfactory_no_such_module_xyz")
    with pytest.raises(SpecError, match="importing envfactory_no_such_module_xyz .*failed"):
        registry.spec("Ghost-v0")
    registry.register_lazy("Hollow-v0", "json")  # imports, but registers nothing
    with pytest.raises(SpecError, match="did not register it"):
        registry.spec("Hollow-v0")
    with pytest.raises(SpecError, match="already announced"):
        registry.register_lazy("Hollow-v0", "csv")
    gym = sys.modules.get("gymnasium")
    for name in ("Ghost-v0", "Hollow-v0"):
        if gym is not None:
            gym.registry.pop(f"envfactory/{name}", None)


def test_old_callable_plugins_still_register(monkeypatch):
    """The eager entry-point form (a function that imports modules and returns None) keeps working."""
    from importlib import metadata

    from envfactory import registry

    calls = []

    class EP:
        name, value = "old-style", "somewhere:register"

        def load(self):
            return lambda: calls.append(1)

    class TableEP(EP):
        name = "table"

        def load(self):
            return {"Counter-v0": "environments.counter"}

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EP(), TableEP()])
    monkeypatch.setattr(registry, "_LAZY", dict(registry._LAZY))
    assert registry.discover(force=True) == {} and calls == [1]
    assert registry.spec("Counter-v0").name == "Counter-v0"


# -- CI: a missing torch is a failure, not a skip ----------------------------------
def test_missing_required_module_fails_under_ci(tmp_path):
    src = (ROOT / "tests" / "conftest.py").read_text()
    src, n = re.subn(r"CI_REQUIRED_MODULES = \([^)]*\)", 'CI_REQUIRED_MODULES = ("torch_not_installed_xyz",)', src)
    assert n == 1
    assert "torch_not_installed_xyz" in src
    (tmp_path / "conftest.py").write_text(src)
    (tmp_path / "test_needs_it.py").write_text(textwrap.dedent("""
        import pytest

        def test_free_of_it():
            pass

        pytest.importorskip("torch_not_installed_xyz")

        def test_uses_it():
            pass
    """))
    (tmp_path / "test_needs_it_in_a_test.py").write_text(textwrap.dedent("""
        import pytest

        def test_uses_it():
            pytest.importorskip("torch_not_installed_xyz")
    """))

    def run(ci: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "CI"} | {"CI": ci}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        return r.stdout

    laptop = run("")
    assert "2 skipped" in laptop and "failed" not in laptop and "error" not in laptop, laptop
    ci = run("true")
    assert "2 failed" in ci and "skipped" not in ci and "error" not in ci, ci
    assert "CI=true: a missing torch_not_installed_xyz is a failure" in ci, ci


def test_modules_import_cheaply():
    """`import envfactory` stays cheap: it loads none of the heavy optional stacks (what the
    import costs is measured, not asserted: a time bound flakes on a loaded 2-core machine)."""
    heavy = ["torch", "transformers", "numpy", "gymnasium", "pettingzoo", "docker", "ray", "mcp", "httpx",
             "yaml", "vllm", "openenv", "starlette", "uvicorn", "tokenizers", "hypothesis"]
    code = ("import sys, json; before = set(sys.modules); import envfactory; "
            "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    loaded = set(json.loads(_fresh(code).stdout))
    assert not loaded & set(heavy), sorted(loaded & set(heavy))
    assert importlib.util.find_spec("envfactory") is not None
