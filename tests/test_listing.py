"""``envfactory list`` from a cache: the entries equal what synthesis gives, and a changed
definition (its module, a file it imports, its spec file) is described again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import envfactory
from envfactory.registry import listing, listing_cache_path

ROOT = Path(__file__).resolve().parents[1]

_LIST = """
import json, sys
sys.path.insert(0, {extra!r})
from envfactory.registry import listing, register_lazy
for name, module in {announce!r}.items():
    register_lazy(name, module)
rows = listing({names!r})
print(json.dumps({{"rows": rows, "imported": sorted(m for m in {watch!r} if m in sys.modules)}}))
"""


def _list(cache: Path, names: list[str], *, extra: str = "", announce: dict | None = None,
          watch: tuple[str, ...] = ()) -> dict:
    """``listing(names)`` in a fresh interpreter (nothing built in-process) on the cache ``cache``."""
    code = _LIST.format(extra=extra, announce=announce or {}, names=names, watch=list(watch))
    env = {**os.environ, "ENVFACTORY_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cached_counts_equal_a_fresh_synthesis(tmp_path):
    names = ["Bank-v0", "Counter-v0", "Hotel-v1"]  # a module, a small one, a synthesized spec file
    modules = ("environments.bank", "environments.counter", "environments.spec_envs.hotel")
    cold = _list(tmp_path, names, watch=modules)
    assert cold["imported"] == sorted(modules)
    assert listing_cache_path().name.startswith("listing-") and len(list(tmp_path.glob("listing-*.json"))) == 1
    warm = _list(tmp_path, names, watch=modules)
    assert warm["imported"] == []  # nothing imported, nothing synthesized
    assert warm["rows"] == cold["rows"]
    fresh = {n: envfactory.spec(n) for n in names}
    for row in warm["rows"]:
        s = fresh[row["name"]]
        assert row["tasks"] == len(s.get_tasks()) and row["tools"] == len(s.all_tools), row
        assert row == s.describe()


def test_in_process_listing_without_cache_is_describe(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVFACTORY_CACHE", str(tmp_path))
    assert listing(["Counter-v0"], cache=False) == [envfactory.spec("Counter-v0").describe()]
    assert not list(tmp_path.glob("listing*"))


_MODULE = '''
from envfactory import State, Task, ToolEnvSpec, call, register, tool
from {helper} import COUNT


class S(State):
    n: int = 0


@tool
def bump(state: S) -> str:
    """Add one."""
    state.n += 1
    return str(state.n)


register(ToolEnvSpec(
    name="ListingProbe-v0", domain="probe", state_type=S, tools=[bump],
    tasks=lambda: [Task(id=f"t{{i}}", instruction=f"bump {{i + 1}} times", initial_state=S(),
                        solution=[call("bump")] * (i + 1)) for i in range(COUNT)]))
'''


def test_a_changed_definition_is_described_again(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    module, helper = "listing_probe_env", "listing_probe_count"
    (src / f"{module}.py").write_text(_MODULE.format(helper=helper))
    (src / f"{helper}.py").write_text("COUNT = 2\n")
    cache = tmp_path / "cache"

    def run() -> tuple[int, bool]:
        out = _list(cache, ["ListingProbe-v0"], extra=str(src), announce={"ListingProbe-v0": module},
                    watch=(module,))
        (row,) = out["rows"]
        return row["tasks"], module in out["imported"]

    assert run() == (2, True)   # cold: imported and built
    assert run() == (2, False)  # warm: from the cache
    (src / f"{helper}.py").write_text("COUNT = 3  # three\n")  # a file the definition imports changed
    assert run() == (3, True)
    assert run() == (3, False)
    (src / f"{module}.py").write_text(_MODULE.format(helper=helper).replace("Add one.", "Add one to n."))
    assert run() == (3, True)  # the module itself changed (same count, described again)
    (cached,) = cache.glob("listing-*.json")
    cached.write_text("{not json")
    assert run() == (3, True)  # an unreadable cache is rebuilt, never trusted


def test_list_command_uses_the_listing(monkeypatch):
    rows = [{"name": "A-v0", "domain": "x", "multi_agent": False, "tasks": 4, "tools": 2, "description": "d"}]
    monkeypatch.setattr(envfactory.registry, "listing", lambda **kw: rows)
    from envfactory.cli.environments import LIST

    code, out, text = LIST.run(None)
    assert code == 0 and out == rows and "A-v0" in text


def test_a_spec_file_change_invalidates_its_entry(tmp_path):
    """A spec file's module is its YAML file: editing the file describes its environments again."""
    spec_dir = ROOT / "environments" / "specs"
    yaml_src = (spec_dir / "hotel.yaml").read_text()
    cache = tmp_path / "cache"
    watch = ("environments.spec_envs.hotel",)
    _list(cache, ["Hotel-v0"], watch=watch)
    assert _list(cache, ["Hotel-v0"], watch=watch)["imported"] == []
    (cached,) = cache.glob("listing-*.json")
    doc = json.loads(cached.read_text())
    (files,) = {i["deps"] for i in doc["envs"].values()}
    hotel = str(spec_dir / "hotel.yaml")
    assert hotel in doc["depsets"][files]["files"]  # the YAML file is one of the entry's sources
    # pretend the file changed since (a different stamp): the entry is stale
    doc["depsets"][files]["files"][hotel] = [0, len(yaml_src)]
    cached.write_text(json.dumps(doc))
    assert _list(cache, ["Hotel-v0"], watch=watch)["imported"] == list(watch)


def test_touching_one_spec_file_rebuilds_only_its_entries(tmp_path):
    """Entries built side by side (in one process, or the same worker) each keep only the sources
    they read: a spec file, a composed file's services, a module and the tool library it imports.
    Touching one file describes again only the entries built from it."""
    names = ["Hotel-v0", "Hotel-v1", "Bank-v0", "Counter-v0", "AnimalCareNetwork-v0", "Library-v0"]
    cache = tmp_path / "cache"
    _list(cache, names)
    (cached,) = cache.glob("listing-*.json")
    doc = json.loads(cached.read_text())
    sources = {n: doc["depsets"][e["deps"]]["files"] for n, e in doc["envs"].items()}
    specs = ROOT / "environments" / "specs"

    assert str(specs / "hotel.yaml") in sources["Hotel-v0"] and str(specs / "hotel.yaml") in sources["Hotel-v1"]
    assert str(specs / "hotel.yaml") not in sources["Bank-v0"]
    assert {str(specs / "shelter.yaml"), str(specs / "vet_clinic.yaml")} <= set(sources["AnimalCareNetwork-v0"])
    assert str(ROOT / "tools" / "banking.py") in sources["Bank-v0"]
    assert str(ROOT / "environments" / "counter.py") not in sources["Bank-v0"]
    for f, n in (("hotel.yaml", "Hotel-v0"), ("library.yaml", "Library-v0")):
        assert str(specs / f) in sources[n]
    assert {n for n in names if str(specs / "hotel.yaml") in sources[n]} == {"Hotel-v0", "Hotel-v1"}
    assert {n for n in names if str(specs / "shelter.yaml") in sources[n]} == {"AnimalCareNetwork-v0"}
    # and a warm listing after touching hotel.yaml for real rebuilds Hotel's two and nothing else
    touched = json.loads(cached.read_text())
    for deps in touched["depsets"]:
        if str(specs / "hotel.yaml") in deps["files"]:
            deps["files"][str(specs / "hotel.yaml")] = [1, 1]
    cached.write_text(json.dumps(touched))
    watch = tuple(sorted({"environments.spec_envs.hotel", "environments.bank", "environments.counter",
                          "environments.spec_envs.composed_animal_care_network", "environments.spec_envs.library"}))
    out = _list(cache, names, watch=watch)
    assert out["imported"] == ["environments.spec_envs.hotel"]
    assert _list(cache, names, watch=watch)["imported"] == []


def test_installing_a_package_rebuilds_nothing(tmp_path, monkeypatch):
    """Third-party packages count by distribution and version, and the import path is not part of the
    cache's key: a new directory on the path (an editable install) or a new distribution leaves every
    entry as it was; a package that another checkout provides first rebuilds the entries from it."""
    cache = tmp_path / "cache"
    names = ["Counter-v0", "Bank-v0"]
    watch = ("environments.counter", "environments.bank")
    _list(cache, names, watch=watch)
    (cached,) = cache.glob("listing-*.json")
    doc = json.loads(cached.read_text())
    deps = doc["depsets"][doc["envs"]["Bank-v0"]["deps"]]
    assert deps["dists"].get("pydantic") and not any("site-packages" in f for f in deps["files"])
    installed = tmp_path / "site"
    (installed / "freshly_installed-1.0.dist-info").mkdir(parents=True)
    (installed / "freshly_installed-1.0.dist-info" / "METADATA").write_text("Name: freshly-installed\nVersion: 1.0\n")
    (installed / "freshly_installed").mkdir()
    (installed / "freshly_installed" / "__init__.py").write_text("")
    assert _list(cache, names, extra=str(installed), watch=watch)["imported"] == []
    # a checkout whose `tools` package is found first: Bank-v0 (built on tools.banking) again
    checkout = tmp_path / "checkout"
    (checkout / "tools").mkdir(parents=True)
    for f in (ROOT / "tools").glob("*.py"):
        (checkout / "tools" / f.name).write_text(f.read_text())
    assert _list(cache, names, extra=str(checkout), watch=watch)["imported"] == ["environments.bank"]
    # a distribution at another version: rebuilt
    doc = json.loads(cached.read_text())
    for d in doc["depsets"]:
        d["dists"]["pydantic"] = "0.0.1"
    cached.write_text(json.dumps(doc))
    assert _list(cache, names, watch=watch)["imported"] == sorted(watch)


def test_another_import_path_reads_the_same_cache(monkeypatch, tmp_path):
    """The import path is not part of the cache file's key (each entry checks where its packages
    resolve instead); the Python (version and prefix: a virtual environment) is."""
    monkeypatch.setenv("ENVFACTORY_CACHE", str(tmp_path))
    here = listing_cache_path()
    monkeypatch.setattr(sys, "path", ["/elsewhere/checkout", *sys.path])
    assert listing_cache_path() == here
    monkeypatch.setattr(sys, "prefix", "/another/venv")
    assert listing_cache_path() != here and listing_cache_path().parent == tmp_path


def test_the_first_make_builds_only_its_own_tasks():
    """make() and reset() of one environment build that environment's tasks, not those of the
    other environments of its spec file (or of any other module)."""
    code = """
import envfactory
from envfactory import registry
env = envfactory.make("Hotel-v1")
env.reset(seed=0)
built = sorted(n for n, s in registry._REGISTRY.items() if getattr(s, "_tasks", None) is not None)
print(built)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['Hotel-v1']"
