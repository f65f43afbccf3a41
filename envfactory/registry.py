"""The registry: register environments, find them through entry points, make them.

Registration is lazy, as in Gymnasium: an environment is known by name and by
the module whose import registers it, and that module is imported only when
the environment is first used (:func:`make`, :func:`spec`); :func:`specs`
imports them all. Packages announce environments in the entry-point group
``envfactory.environments``. An entry point may name

* a mapping, or a function returning one, ``{name: "package.module"}`` (lazy;
  a value may also be ``{"module": "package.module", "multi_agent": True}``), or
* a module, or a function that imports its modules and returns ``None`` (the
  older, eager form: everything is imported on discovery).

Every registered single-agent environment is also a Gymnasium id,
``envfactory/<Name>-v<N>``. ``import envfactory`` does not import gymnasium:
the ids are registered (with a string entry point, importing no environment)
as soon as gymnasium is imported, or at once if it already is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .definition import DEFAULT_SPLIT, DrawSplit, SpecError, did_you_mean, split_members
from .episode import Episode
from .task import Task

__all__ = ["register", "register_lazy", "names", "make", "make_multi", "spec", "specs", "discover", "ENTRY_POINT_GROUP",
           "RUNTIMES", "listing", "listing_cache_path"]

ENTRY_POINT_GROUP = "envfactory.environments"
GYM_NAMESPACE = "envfactory"
# runtime name -> the World class that hosts the state ("module:attribute", imported on use)
RUNTIMES = {"local": "envfactory.world:LocalWorld", "docker": "envfactory.runtime.docker:ContainerWorld",
            "ray": "envfactory.runtime.ray_world:RayWorld"}

_REGISTRY: dict[str, Any] = {}          # name -> spec (its module is imported)
_LAZY: dict[str, "_Lazy"] = {}          # name -> where it will come from (not imported yet)
_ANNOUNCED: dict[str, str] = {}         # name -> the module announced for it (kept once imported): the listing cache
_discovered = False
_discovery_errors: dict[str, str] = {}  # entry point or module -> error
_lock = threading.RLock()


class _Lazy:
    __slots__ = ("module", "multi_agent", "source")

    def __init__(self, module: str, multi_agent: bool, source: str) -> None:
        self.module, self.multi_agent, self.source = module, multi_agent, source


def register(env_spec: Any, *, replace: bool = False) -> Any:
    """Register an environment definition and its Gymnasium id.

    Args:
        env_spec: A :class:`ToolEnvSpec`.
        replace: Allow replacing an existing registration of the same name.

    Returns:
        The spec, so that ``SPEC = register(ToolEnvSpec(...))`` reads naturally.
    """
    name = getattr(env_spec, "name", None)
    if not isinstance(name, str):
        raise SpecError(f"cannot register {env_spec!r}: it has no name")
    if name in _REGISTRY and _REGISTRY[name] is not env_spec and not replace:
        raise SpecError(
            f"an environment named {name!r} is already registered "
            f"(from {_REGISTRY[name].module}); pass replace=True to override it"
        )
    if getattr(env_spec, "module", None) is None:
        frame = inspect.currentframe()
        caller = frame.f_back if frame else None
        env_spec.module = caller.f_globals.get("__name__") if caller else None
    with _lock:
        _REGISTRY[name] = env_spec
        _LAZY.pop(name, None)
        if _ANNOUNCED.get(name) not in (None, env_spec.module):
            del _ANNOUNCED[name]  # replaced by another module's spec: not what the announcement names
    _register_gym(name, bool(getattr(env_spec, "multi_agent", False)))
    return env_spec


def register_lazy(name: str, module: str, *, multi_agent: bool = False, replace: bool = False,
                  _source: str = "register_lazy") -> None:
    """Announce that importing ``module`` registers the environment ``name``.

    Nothing is imported now; :func:`make` / :func:`spec` import the module on first
    use. The Gymnasium id of a single-agent environment is registered right away
    (as a string entry point) once gymnasium is imported.
    """
    if not isinstance(name, str) or not isinstance(module, str) or not module:
        raise SpecError(f"register_lazy needs a name and a module path, got {name!r} -> {module!r}")
    with _lock:
        if name in _REGISTRY:
            if not replace:
                if getattr(_REGISTRY[name], "module", None) == module:
                    _ANNOUNCED[name] = module
                return  # already imported and registered: the table adds nothing
            del _REGISTRY[name]
        elif name in _LAZY and _LAZY[name].module != module and not replace:
            raise SpecError(
                f"an environment named {name!r} is already announced by {_LAZY[name].source} "
                f"(module {_LAZY[name].module}); {_source} announces it again (module {module})"
            )
        _LAZY[name] = _Lazy(module, multi_agent, _source)
        _ANNOUNCED[name] = module
    _register_gym(name, multi_agent)


def _add_table(table: Mapping[str, Any], source: str) -> None:
    for name, target in table.items():
        if isinstance(target, str):
            module, multi = target, False
        elif isinstance(target, Mapping) and isinstance(target.get("module"), str):
            module, multi = target["module"], bool(target.get("multi_agent", False))
        else:
            raise SpecError(f"{source}: environment {name!r} -> {target!r}: expected a module path "
                            "or {'module': ..., 'multi_agent': ...}")
        register_lazy(name, module, multi_agent=multi, _source=f"entry point {source!r}")


# -- Gymnasium ids ------------------------------------------------------------
_gym_ready = False  # gymnasium is fully imported and our ids are in its registry


def _register_gym(name: str, multi_agent: bool) -> None:
    """Register (or refresh) ``envfactory/<name>`` if gymnasium is loaded; otherwise the
    import hook does it when gymnasium is imported."""
    if multi_agent or not _gym_ready:
        return
    import gymnasium

    gym_id = f"{GYM_NAMESPACE}/{name}"
    if gym_id in gymnasium.registry:
        del gymnasium.registry[gym_id]
    gymnasium.register(
        id=gym_id,
        entry_point="envfactory.faces.gym_env:ToolGymEnv",
        # gymnasium.make_vec(id, n): several episodes in worker processes, text passed by pipe
        vector_entry_point="envfactory.faces.gym_env:make_vector_env",
        kwargs={"env_name": name},
        disable_env_checker=False,
    )
    # Gymnasium reads "-vN" as version N of one family and warns that FindLight-v0 is "out of
    # date" because FindLight-v3 exists; an envfactory name is one environment, its "-vN" part
    # of the name (FindLight-v0..v3 are four families). Say so in the spec: the whole name, no
    # version. The id (and gymnasium.make's lookup by it) is unchanged.
    registered = gymnasium.registry[gym_id]
    registered.name, registered.version = name, None


def _gym_now_available() -> None:
    """gymnasium has just been imported (or was already): discover, then register every id."""
    global _gym_ready
    _gym_ready = True
    discover(_defer_on_error=True)
    with _lock:
        known = [(n, bool(getattr(s, "multi_agent", False))) for n, s in _REGISTRY.items()]
        known += [(n, lz.multi_agent) for n, lz in _LAZY.items()]
    for name, multi in known:
        _register_gym(name, multi)


class _GymnasiumImportHook(importlib.abc.MetaPathFinder):
    """Runs :func:`_gym_now_available` right after ``import gymnasium`` completes, so that
    ``gymnasium.make("envfactory/...")`` works without envfactory importing gymnasium itself."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "gymnasium":
            return None
        _remove_hook()
        import importlib.util

        found = importlib.util.find_spec("gymnasium")
        if found is None or found.loader is None:
            return found
        found.loader = _AfterExecLoader(found.loader)
        return found


class _AfterExecLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        try:
            _gym_now_available()
        except Exception as exc:  # never break `import gymnasium`
            warnings.warn(f"envfactory: registering Gymnasium ids failed: {exc}", RuntimeWarning, stacklevel=2)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code, ...
        return getattr(self._inner, name)


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _GymnasiumImportHook)]


def install_gym_hook() -> None:
    """Make the Gymnasium ids available: now if gymnasium is imported, else when it is."""
    gym = sys.modules.get("gymnasium")
    if gym is not None and hasattr(gym, "register") and hasattr(gym, "registry"):
        _gym_now_available()
    elif not any(isinstance(f, _GymnasiumImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _GymnasiumImportHook())


# -- discovery ----------------------------------------------------------------
def discover(*, force: bool = False, _defer_on_error: bool = False) -> dict[str, str]:
    """Read the ``envfactory.environments`` entry points (lazy tables; eager plugins are imported).

    A plugin that fails to load is reported (returned and warned about), not
    fatal: one broken package must not hide every other environment.
    Set ``ENVFACTORY_NO_PLUGINS=1`` to skip discovery.

    Returns:
        ``{entry point name: error}`` for plugins that failed.
    """
    global _discovered
    with _lock:
        if (_discovered and not force) or os.environ.get("ENVFACTORY_NO_PLUGINS") == "1":
            return dict(_discovery_errors)
        _discovered = True
        from importlib import metadata

        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                if callable(obj) and not inspect.ismodule(obj) and not isinstance(obj, Mapping):
                    obj = obj()  # a table (lazy) or None (it registered eagerly)
                if isinstance(obj, Mapping):
                    _add_table(obj, ep.name)
            except Exception as exc:  # report, keep going
                if _defer_on_error:
                    # triggered from inside a plugin module's own import (a circular,
                    # partial import): try again on first use.
                    _discovered = False
                    return {}
                _discovery_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"envfactory: environment plugin {ep.name!r} ({ep.value}) failed to load: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return dict(_discovery_errors)


def _import_lazy(name: str) -> None:
    """Import the module announced for ``name`` (it registers the spec)."""
    lazy = _LAZY.get(name)
    if lazy is None:
        return
    try:
        importlib.import_module(lazy.module)
    except Exception as exc:
        raise SpecError(f"environment {name!r}: importing {lazy.module} (announced by {lazy.source}) "
                        f"failed: {type(exc).__name__}: {exc}") from exc
    if name not in _REGISTRY:
        raise SpecError(f"environment {name!r}: {lazy.source} announced it in module {lazy.module}, "
                        "but importing that module did not register it")


def spec(name: str) -> Any:
    """The registered spec called ``name`` (``envfactory/`` prefix allowed); imports its module."""
    if name.startswith(GYM_NAMESPACE + "/"):
        name = name[len(GYM_NAMESPACE) + 1 :]
    if name not in _REGISTRY:
        discover()
        _import_lazy(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        known = names()
        hint = did_you_mean(name, known) if known else "; none is registered"
        raise KeyError(f"no environment named {name!r}{hint} ('envfactory list' shows all {len(known)})"
                       ) from None


def names() -> list[str]:
    """Every known environment name, sorted, without importing any environment module."""
    discover()
    return sorted(set(_REGISTRY) | set(_LAZY))


def specs() -> list[Any]:
    """Every registered spec, sorted by name (imports every announced module).

    A module that fails to import is warned about and skipped."""
    discover()
    for module in sorted({lz.module for lz in list(_LAZY.values())}):
        pending = [n for n, lz in list(_LAZY.items()) if lz.module == module]
        try:
            importlib.import_module(module)
        except Exception as exc:
            _discovery_errors[module] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"envfactory: environment module {module} ({', '.join(pending)}) failed to import: "
                          f"{exc}", RuntimeWarning, stacklevel=2)
            continue
        for n in pending:
            if n not in _REGISTRY and n in _LAZY:
                warnings.warn(f"envfactory: {module} was announced to register {n!r} but did not",
                              RuntimeWarning, stacklevel=2)
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


# -- the listing (``envfactory list``) ------------------------------------------
_LISTING_FORMAT = 2


def listing_cache_path() -> Path:
    """Where :func:`listing` keeps its rows: ``$ENVFACTORY_CACHE/listing-<key>.json`` (default
    ``~/.cache/envfactory``), one file per Python (its version and prefix: a virtual environment) and
    envfactory location. The import path is not part of the key (an editable ``pip install`` of
    another package adds to it): each entry records where its packages were found instead, and is
    described again when they resolve elsewhere (another checkout first on the path)."""
    import hashlib
    import json

    root = os.environ.get("ENVFACTORY_CACHE")
    here = os.path.dirname(os.path.realpath(__file__))
    key = hashlib.sha256(json.dumps([sys.version, here, sys.prefix]).encode()).hexdigest()[:16]
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "envfactory") / f"listing-{key}.json"


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


class _Sources:
    """What one listing entry was built from, found in the process that built it: the files it read
    (its module, the modules that module imports, transitively, a spec file and the spec files it
    composes), the engine (every loaded ``envfactory`` module), and the third-party distributions
    loaded, by version (not by file: reinstalling one, or installing another package, changes nothing).

    Files are recorded three ways, so that none is missed while the entry's siblings share the
    process: the modules loaded while it was built, every file opened meanwhile (an audit hook,
    active only while an entry is built), and the static imports of its module's closure (a module
    that an earlier entry loaded is imported again for free, so only its source says it is used)."""

    _opened: set[str] | None = None
    _hooked = False
    _dists: dict[str, list[str]] | None = None
    _parsed: dict[str, tuple[str, ...]] = {}

    @classmethod
    def _audit(cls, event: str, args: tuple[Any, ...]) -> None:
        opened = cls._opened
        if opened is not None and event == "open" and args:
            path = args[0]
            if isinstance(path, (str, os.PathLike)):
                opened.add(os.fspath(path))

    @classmethod
    def start(cls) -> set[str]:
        if not cls._hooked:
            sys.addaudithook(cls._audit)  # (hooks cannot be removed: it does nothing outside a build)
            cls._hooked = True
        opened: set[str] = set()
        cls._opened = opened
        return opened

    @classmethod
    def stop(cls) -> None:
        cls._opened = None

    @staticmethod
    def _places() -> tuple[tuple[str, ...], tuple[str, ...]]:
        import sysconfig

        paths = sysconfig.get_paths()
        return (tuple({os.path.realpath(paths["stdlib"]), os.path.realpath(paths["platstdlib"])}),
                tuple({os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])}))

    @classmethod
    def _imports(cls, module: str, file: str) -> tuple[str, ...]:
        """The absolute names a module's source imports (anywhere in it: functions' lazy imports too)."""
        if file not in cls._parsed:
            import ast

            found: list[str] = []
            try:
                tree = ast.parse(Path(file).read_bytes())
            except (OSError, SyntaxError, ValueError):
                tree = None
            package = module if os.path.basename(file).startswith("__init__.") else module.rpartition(".")[0]
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.Import):
                    found += [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")
                        parts = parts[: len(parts) - node.level + 1] if node.level > 1 else parts
                        base = ".".join([*parts, base] if base else parts)
                    found.append(base)
                    found += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
            cls._parsed[file] = tuple(n for n in found if n)
        return cls._parsed[file]

    @classmethod
    def _dist_of(cls, top: str) -> list[str]:
        if cls._dists is None:
            from importlib import metadata

            try:
                cls._dists = {k: sorted(set(v)) for k, v in metadata.packages_distributions().items()}
            except Exception:  # noqa: BLE001 - broken metadata: no distribution is known
                cls._dists = {}
        return cls._dists.get(top, [])

    @classmethod
    def of(cls, name: str, module: str | None, before: set[str], opened: set[str]) -> dict[str, Any]:
        """The sources of the entry ``name`` (announced in ``module``) just built; ``before``: the
        modules loaded when its build began; ``opened``: the files opened during it."""
        from importlib import metadata

        std, site = cls._places()
        engine = os.path.dirname(os.path.realpath(__file__)) + os.sep
        files: set[str] = set()
        tops: set[str] = set()      # third-party top-level packages
        roots: dict[str, str] = {}  # first-party top-level package -> where it was found

        def where(mod_name: str) -> str | None:
            m = sys.modules.get(mod_name)
            f = getattr(m, "__file__", None)
            return os.path.realpath(f) if isinstance(f, str) else None

        def classify(mod_name: str, f: str) -> str:
            if f.startswith(site):
                tops.add(mod_name.partition(".")[0])
                return "site"
            if f.startswith(std):
                return "std"
            files.add(f)
            top = mod_name.partition(".")[0]
            if top not in roots:
                roots[top] = where(top) or f
            return "own"

        # the engine, everything the build loaded, and every third-party package loaded here (by
        # version: an upgrade of one of them is rare, and then it is safer to build again)
        for mod_name in list(sys.modules):
            f = where(mod_name)
            if f is None:
                continue
            if f.startswith(engine) or f.startswith(site) or mod_name not in before:
                classify(mod_name, f)
        # the closure of the announced module's imports (first-party sources only)
        queue = [module] if module else []
        seen: set[str] = set()
        while queue:
            mod_name = queue.pop()
            if mod_name in seen:
                continue
            seen.add(mod_name)
            parts = mod_name.split(".")
            queue += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
            f = where(mod_name)
            if f is None or classify(mod_name, f) != "own" or f.startswith(engine):
                continue
            if f.endswith(".py"):
                queue += [n for n in cls._imports(mod_name, f) if n in sys.modules]
        # data files it read (a spec file, the spec files a composed one names)
        for f in opened:
            real = os.path.realpath(f)
            if not real.endswith((".pyc", ".pyo")) and not real.startswith(std + site) and os.path.isfile(real):
                files.add(real)
        dists: dict[str, str | None] = {}
        for top in sorted(tops):
            for dist in cls._dist_of(top):
                try:
                    dists[dist] = metadata.version(dist)
                except Exception:  # noqa: BLE001
                    dists[dist] = None
        return {"files": {f: _stamp(f) for f in sorted(files)}, "dists": dists, "roots": roots}


def _read_listing(path: Path) -> dict[str, Any]:
    import json

    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = (isinstance(doc, dict) and doc.get("format") == _LISTING_FORMAT and doc.get("python") == sys.version
          and isinstance(doc.get("envs"), dict) and isinstance(doc.get("depsets"), list)
          and all(isinstance(d, dict) and isinstance(d.get("files"), dict) and isinstance(d.get("dists"), dict)
                  and isinstance(d.get("roots"), dict) for d in doc["depsets"]))
    return doc if ok else {}


def _write_listing(path: Path, doc: dict[str, Any]) -> None:
    import json
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".listing.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # a read-only home: the listing is computed every time, never wrong


class _Checker:
    """Whether a cached entry's sources are as they were; each file, distribution and package is
    looked at once per listing."""

    def __init__(self) -> None:
        self.stamps: dict[str, Any] = {}
        self.versions: dict[str, Any] = {}
        self.origins: dict[str, Any] = {}

    def version(self, dist: str) -> str | None:
        if dist not in self.versions:
            from importlib import metadata

            try:
                self.versions[dist] = metadata.version(dist)
            except Exception:  # noqa: BLE001 - uninstalled
                self.versions[dist] = None
        return self.versions[dist]

    def origin(self, top: str) -> str | None:
        if top not in self.origins:
            import importlib.util

            try:
                m = sys.modules.get(top)
                found = getattr(m, "__file__", None) if m is not None else getattr(
                    importlib.util.find_spec(top), "origin", None)
            except (ImportError, ValueError):
                found = None
            self.origins[top] = os.path.realpath(found) if isinstance(found, str) else None
        return self.origins[top]

    def unchanged(self, deps: dict[str, Any]) -> bool:
        for f, then in deps["files"].items():
            if f not in self.stamps:
                self.stamps[f] = _stamp(f)
            if self.stamps[f] is None or self.stamps[f] != then:
                return False
        return all(self.version(d) == v for d, v in deps["dists"].items()) and \
            all(self.origin(t) == o for t, o in deps["roots"].items())


Progress = Any  # Callable[[int, int, str | None], None]: (done, total, the name just built or None)


def listing(only: Iterable[str] | None = None, *, cache: bool = True, progress: Progress = None
            ) -> list[dict[str, Any]]:
    """Every environment's listing entry (``spec.describe()``: name, domain, multi_agent, tasks,
    tools, description), sorted by name: what ``envfactory list`` prints.

    Counting an environment's tasks means building them (synthesis and a replay of every reference
    solution: seconds per family), so the entries of announced environments (entry points,
    :func:`register_lazy`) are kept in :func:`listing_cache_path`, each with the sources it was
    really built from (:class:`_Sources`: the files it read, with their modification times and
    sizes; the ``envfactory`` engine's files; the versions of the third-party distributions
    involved; where its packages were found). An entry is used only while all of those are
    unchanged; otherwise that environment alone is imported and described again: editing one spec
    file rebuilds that file's entries, and installing an unrelated package rebuilds none. A listing
    on a warm cache imports no environment module. Environments registered directly (not
    announced), and those whose tasks are already built in this process, are described afresh.

    Args:
        only: These environments (default: every known one).
        cache: Read and update the cache (``False``: describe every environment afresh).
        progress: Called ``progress(done, total, name)`` as entries are built: once with
            ``(0, total, None)`` before the first (only when some must be built), then after each.
    """
    import json

    discover()
    path = listing_cache_path()
    doc = _read_listing(path) if cache else {}
    envs: dict[str, Any] = doc.get("envs", {})
    depsets: list[dict[str, Any]] = doc.get("depsets", [])
    check = _Checker()

    def fresh(entry: Any) -> bool:
        try:
            return check.unchanged(depsets[entry["deps"]])
        except (KeyError, IndexError, TypeError, AttributeError):
            return False

    rows: dict[str, dict[str, Any]] = {}
    built: dict[str, dict[str, Any]] = {}  # name -> its sources
    todo: list[str] = []   # described here (already imported)
    cold: list[str] = []   # announced environments to build: in worker processes when there are many
    for name in (names() if only is None else [n.removeprefix(GYM_NAMESPACE + "/") for n in only]):
        s = _REGISTRY.get(name)
        module = _ANNOUNCED.get(name)
        cacheable = module is not None and (s is None or getattr(s, "module", None) == module)
        if s is not None and (not cacheable or getattr(s, "_tasks", None) is not None):
            rows[name] = s.describe()  # already built here (or not announced): no synthesis to save
            continue
        entry = envs.get(name) if cacheable else None
        if isinstance(entry, dict) and entry.get("module") == module and isinstance(entry.get("row"), dict) \
                and fresh(entry):
            rows[name] = dict(entry["row"])
            continue
        (cold if cacheable and s is None else todo).append(name)
    total = len(todo) + len(cold)
    if progress is not None and total:
        progress(0, total, None)
    workers = _listing_workers(len(cold))
    found = _describe_elsewhere(cold, workers) if workers > 1 else (_describe_one(n) for n in cold)
    done = 0
    for result in _chain((_describe_one(n) for n in todo), found):
        done += 1
        if _record(result, rows):  # every one of todo and cold is announced (cacheable)
            built[result[0]] = result[3]
        if progress is not None:
            progress(done, total, result[0])
    if cache and built:
        index = {json.dumps(d, sort_keys=True): i for i, d in enumerate(depsets)}
        for name, deps in built.items():
            key = json.dumps(deps, sort_keys=True)
            if key not in index:
                index[key] = len(depsets)
                depsets.append(deps)
            envs[name] = {"module": _ANNOUNCED[name], "row": rows[name], "deps": index[key]}
        # keep only the dependency sets that an entry still uses
        used = sorted({e["deps"] for e in envs.values() if isinstance(e, dict) and isinstance(e.get("deps"), int)
                       and 0 <= e["deps"] < len(depsets)})
        renumber = {old: new for new, old in enumerate(used)}
        envs = {n: {**e, "deps": renumber[e["deps"]]} for n, e in envs.items()
                if isinstance(e, dict) and e.get("deps") in renumber}
        depsets = [depsets[i] for i in used]
        _write_listing(path, {"format": _LISTING_FORMAT, "python": sys.version, "envs": envs, "depsets": depsets})
    return [rows[n] for n in sorted(rows)]


def _chain(*parts: Iterable[Any]) -> Iterator[Any]:
    for part in parts:
        yield from part


def _record(result: tuple[str, dict[str, Any] | None, str | None, Any], rows: dict[str, dict[str, Any]]) -> bool:
    """Put a :func:`_describe_one` row into ``rows``; ``False`` (warned about and skipped, as
    :func:`specs` does) when the environment's module failed to import."""
    name, row, error, _ = result
    if row is None:
        _discovery_errors[_ANNOUNCED.get(name) or name] = str(error)
        warnings.warn(f"envfactory: {error}", RuntimeWarning, stacklevel=3)
        return False
    rows[name] = row
    return True


LISTING_MIN_PER_WORKER = 8
"""Cold environments per extra worker process before :func:`listing` builds them in parallel."""


def _listing_workers(cold: int) -> int:
    """How many processes build ``cold`` environments' entries: ``ENVFACTORY_LIST_WORKERS``
    (1: in this process), else one per core, at most one per :data:`LISTING_MIN_PER_WORKER`."""
    raw = os.environ.get("ENVFACTORY_LIST_WORKERS", "")
    try:
        most = int(raw) if raw else (os.cpu_count() or 1)
    except ValueError:
        raise ValueError(f"ENVFACTORY_LIST_WORKERS must be a whole number, got {raw!r}") from None
    return max(1, min(most, cold // LISTING_MIN_PER_WORKER))


def _describe_one(name: str) -> tuple[str, dict[str, Any] | None, str | None, dict[str, Any]]:
    """One environment's listing row (or why its module failed to import) and the sources it was
    built from (:class:`_Sources`), in this process or a worker's."""
    before = set(sys.modules)
    opened = _Sources.start()
    try:
        row = spec(name).describe()
    except SpecError as exc:
        return name, None, str(exc), {}
    finally:
        _Sources.stop()
    return name, row, None, _Sources.of(name, _ANNOUNCED.get(name), before, opened)


def _describe_elsewhere(names_: list[str], workers: int) -> Iterator[tuple[str, Any, str | None, Any]]:
    """Build the entries of ``names_`` in ``workers`` fresh processes (task synthesis is CPU-bound:
    a cold listing of every family takes minutes in one process), each as soon as it is built.
    Spawned, not forked: the caller may hold threads."""
    from .processes import worker_pool

    from concurrent.futures import as_completed

    with worker_pool(workers, "spawn") as pool:
        for future in as_completed([pool.submit(_describe_one, n) for n in names_]):
            yield future.result()


def _world_factory(runtime: str) -> Any:
    """The world class registered for ``runtime`` (imported on first use)."""
    try:
        target = RUNTIMES[runtime]
    except (KeyError, TypeError):
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}") from None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise RuntimeError(f"the {runtime} runtime is not available: {exc}") from exc


def make(name: str, runtime: str | None = None, *, max_turns: int | None = None, user: Any = None,
         split: DrawSplit = DEFAULT_SPLIT, **world_options: Any) -> Episode:
    """Create a live episode of a registered environment, for one agent or a team.

    Args:
        name: Registered name, e.g. ``"FileSystem-v0"`` or ``"MultiRecords-v0"``.
        runtime: Where the world runs: ``"local"`` (in-process; the default), ``"docker"``
            (a hardened container) or ``"ray"`` (a Ray actor; ``workers=N``, and
            ``world_runtime="docker"`` for containers driven from the actors); the
            referee always runs here. A spec with a ``make_world(runtime, **options)``
            method builds its own world (a generated module: in a container only, see
            :mod:`envfactory.factory.contained`; it gets ``None`` when no runtime was asked).
        max_turns: Overrides the environment's turn (round) limit.
        user: For environments with a simulated user, a host-side responder that answers
            ``ask_user`` instead of the scripted user (``responder(question, facts, history)``;
            e.g. ``agents.policies.users.LLMUser(policy)``; see :mod:`envfactory.users`).
        split: The tasks ``reset()`` (and ``reset(seed=...)``) draws from: ``"train"`` (the sft
            and rl splits; the default), ``"sft"``, ``"rl"``, ``"eval"`` or ``"all"``. Evaluation
            tasks are drawn only where ``"eval"`` or ``"all"`` is asked for; a task named in
            ``reset(task)`` is always played.
        **world_options: Passed to the world (e.g. ``step_timeout`` for docker).
    """
    s = spec(name)
    split_members(split)  # an unknown split fails before any world starts
    own = getattr(s, "make_world", None)
    if own is not None:
        world = own(runtime, **world_options)
    else:
        world = _world_factory(runtime or "local")(s, **world_options)
    return Episode(s, world, max_turns=max_turns, user=user, split=split)


def task_supply(name: str, difficulty: int = 1, seed: int = 0, kinds: list[str] | None = None) -> Iterator[Task]:
    """An endless, seeded stream of fresh tasks of a registered family at one difficulty (1-5),
    for curricula that never run out of tasks: more rows (so more distractors), more rows per
    goal and longer walks as the difficulty grows. The same arguments give the same tasks.

    Args:
        name: A table-backed family with the goal-level task kinds (``RetailOrders-v1``, every
            spec file that does not pin ``kinds: [steps]``, composed files).
        difficulty: 1 (small tables, one row per goal) to 5.
        seed: Which stream.
        kinds: Only these task kinds (default: every kind the family makes), cycled in order.

    Raises:
        ValueError: the environment has no task supply, or a difficulty or kind it cannot make.
    """
    s = spec(name)
    supply = s.metadata.get("supply") if isinstance(getattr(s, "metadata", None), dict) else None
    if supply is None:
        raise ValueError(f"{name} has no procedural task supply; the table-backed families with goal-level "
                         "task kinds have one (e.g. RetailOrders-v1; see envfactory list)")
    return supply(difficulty, seed, kinds)


def make_multi(name: str, runtime: str | None = None, **kwargs: Any) -> Episode:
    """:func:`make` for a team environment (it refuses a single-agent one)."""
    s = spec(name)
    if not s.multi_agent:
        raise TypeError(f"{s.name} is a single-agent environment; create it with envfactory.make(...)")
    return make(name, runtime, **kwargs)
