"""Offline image builds for the Docker runtime.

An environment image is the local base image (``scripts/base-image.sh`` makes
``envfactory-base:bookworm``; no registry is ever contacted) plus:

1. wheels of envfactory's runtime dependencies, pinned to the versions
   installed on the host (so both runtimes produce identical observations,
   down to validation messages), fetched with ``pip download --only-binary``
   into a host cache and installed in the image with ``pip install --no-index``;
2. a wheel of this project (``envfactory``, ``environments``, ``tools``,
   ``agents``), built from the source tree with ``pip wheel``;
3. environment modules that live outside those packages (test-only or
   user environments): their files are copied into ``/opt/envf-extra``, which
   is on the image's ``PYTHONPATH``, under their module names;
4. what an environment's own code imports beyond envfactory's dependencies
   (``spec.metadata["image_requirements"]``: ``["bfcl-eval==2026.3.23",
   ...]``, pinned), installed without their dependencies, in a layer of
   their own (BFCL's environments bring the ``bfcl-eval`` their classes
   live in).

The tag is ``envfactory-env:<content hash>``: the hash covers the base image
id, the pinned dependencies, the project sources and the extra modules, so an
unchanged environment is never rebuilt. Dependencies and project sit in
separate layers: editing the project rebuilds only its layer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

__all__ = ["BASE_IMAGE", "IMAGE_REPO", "ImageError", "image_for", "build_images", "runtime_requirements",
           "project_root", "extra_modules", "image_requirements"]

BASE_IMAGE = os.environ.get("ENVFACTORY_BASE_IMAGE", "envfactory-base:bookworm")
IMAGE_REPO = "envfactory-env"
PROJECT_PACKAGES = ("envfactory", "environments", "tools", "agents")
WHEEL_CACHE = Path(os.environ.get("ENVFACTORY_WHEEL_CACHE", Path.home() / ".cache" / "envfactory" / "wheels"))
CONTAINER_GLIBC_MINOR = 36  # glibc 2.36: Debian bookworm, the base image
RECIPE = 2  # bump when the Dockerfile below changes

_DOCKERFILE = """\
FROM {base}
COPY deps /wheels/deps
RUN pip install -q --no-index --no-deps /wheels/deps/*.whl
{requirements}COPY project /wheels/project
RUN pip install -q --no-index --no-deps /wheels/project/*.whl
COPY extra /opt/envf-extra
ENV PYTHONPATH=/opt/envf-extra ENVFACTORY_NO_PLUGINS=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
LABEL org.envfactory.image="1" org.envfactory.hash="{hash}"
USER 10001
WORKDIR /tmp
CMD ["python3", "-m", "envfactory.runtime.serve"]
"""

_lock = threading.Lock()
_built: dict[str, str] = {}


class ImageError(RuntimeError):
    """An image could not be built; the message says what to do."""


def project_root() -> Path:
    """The source tree of this project (where ``pyproject.toml`` lives)."""
    root = Path(__file__).resolve().parents[2]  # envfactory/runtime/images.py -> the checkout
    if not (root / "pyproject.toml").is_file():
        raise ImageError(
            f"no pyproject.toml next to the envfactory package ({root}); building images needs the "
            "project's source tree (install it with `pip install -e <checkout>`)"
        )
    return root


def runtime_requirements() -> list[str]:
    """``name==version`` for envfactory's runtime dependencies and theirs,
    pinned to what is installed here (extras such as ``docker`` and ``train``
    are left out: the container needs none of them)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    import tomllib

    env = {"extra": ""}
    seen: dict[str, str] = {}
    # pyproject.toml, not the installed metadata, which may predate an edit of it.
    with open(project_root() / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"].get("dependencies", [])
    todo = [Requirement(r) for r in declared]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise ImageError(f"dependency {req.name} is not installed; run scripts/setup.sh") from None
        seen[name] = dist.version
        todo += [Requirement(r) for r in dist.requires or []]
    return sorted(f"{n}=={v}" for n, v in seen.items())


def extra_modules(specs: Iterable[Any]) -> dict[str, Path]:
    """Environment modules outside the project's packages: ``{module name: file}``."""
    out: dict[str, Path] = {}
    for s in specs:
        mod = getattr(s, "module", None)
        if not mod or mod.split(".")[0] in PROJECT_PACKAGES:
            continue
        m = sys.modules.get(mod)
        path = getattr(m, "__file__", None)
        if path is None:
            found = importlib.util.find_spec(mod)
            path = found.origin if found else None
        if not path:
            raise ImageError(f"{s.name}: cannot find the file of its module {mod!r} to copy into the image")
        if "." in mod or Path(path).name == "__init__.py":
            raise ImageError(
                f"{s.name}: module {mod!r} is not a single top-level file; put the environment in the "
                "project's packages, or in a top-level module file, to run it in Docker"
            )
        out[mod] = Path(path)
    return out


def image_requirements(specs: Iterable[Any]) -> list[str]:
    """What the environments' own code needs in the image beyond envfactory's dependencies: the
    pinned ``name==version`` of each spec's ``metadata["image_requirements"]``, sorted."""
    out: set[str] = set()
    for s in specs:
        for r in (getattr(s, "metadata", None) or {}).get("image_requirements", ()):
            if not isinstance(r, str) or "==" not in r:
                raise ImageError(f"{s.name}: image_requirements holds {r!r}; pin each as 'name==version'")
            out.add(r)
    return sorted(out)


def _project_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml"] + ([root / "README.md"] if (root / "README.md").exists() else [])
    for pkg in PROJECT_PACKAGES:
        d = root / pkg
        if d.is_dir():
            files += sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                            and p.suffix not in (".pyc", ".pyo"))
    return files


def _base_image_id(client: Any) -> str:
    import docker

    try:
        return client.images.get(BASE_IMAGE).id
    except docker.errors.ImageNotFound:
        raise ImageError(
            f"the base image {BASE_IMAGE} does not exist; build it with scripts/base-image.sh "
            "(offline: debootstrap + docker import), or set ENVFACTORY_BASE_IMAGE"
        ) from None


def content_hash(client: Any, extras: dict[str, Path], requirements: list[str] | None = None) -> str:
    """The tag's hash: base image, pinned dependencies, the environments' own requirements, project
    sources, extra modules."""
    root = project_root()
    h = hashlib.sha256()
    h.update(f"recipe={RECIPE}\nbase={_base_image_id(client)}\n".encode())
    h.update("\n".join(runtime_requirements()).encode())
    if requirements:
        h.update(("\0requirements:" + "\n".join(requirements)).encode())
    for p in _project_files(root):
        h.update(b"\0" + str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    for mod in sorted(extras):
        h.update(b"\0extra:" + mod.encode() + b"\0" + extras[mod].read_bytes())
    return h.hexdigest()[:16]


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


def _download_deps(dest: Path, reqs: list[str]) -> None:
    """Binary wheels for the container's Python and glibc, from the host cache
    first, from the package index only for what the cache lacks."""
    machine = platform.machine()
    # pip does not widen a manylinux_2_N platform to older glibc versions here: list them all.
    platforms = [f"manylinux_2_{m}_{machine}" for m in range(17, CONTAINER_GLIBC_MINOR + 1)]
    target = ["--only-binary=:all:", "--no-deps", "--python-version", "3.11",
              *(a for p in platforms + [f"manylinux2014_{machine}"] for a in ("--platform", p))]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    r = _pip("download", "-q", "--no-index", "--find-links", str(WHEEL_CACHE), "-d", str(dest), *target, *reqs)
    if r.returncode == 0:
        return
    r = _pip("download", "-q", "-d", str(WHEEL_CACHE), *target, *reqs)
    if r.returncode != 0:
        raise ImageError(f"pip download of the runtime wheels failed (is PyPI reachable, or "
                         f"{WHEEL_CACHE} filled?):\n{r.stderr[-2000:]}")
    r = _pip("download", "-q", "--no-index", "--find-links", str(WHEEL_CACHE), "-d", str(dest), *target, *reqs)
    if r.returncode != 0:
        raise ImageError(f"pip download from the wheel cache failed:\n{r.stderr[-2000:]}")


def _build_project_wheel(dest: Path) -> None:
    root = project_root()
    with tempfile.TemporaryDirectory(prefix="envf-src-") as tmp:
        src = Path(tmp)
        for p in _project_files(root):
            out = src / p.relative_to(root)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, out)
        # Ship every file of the packages (data files such as environment spec
        # YAMLs included), whatever pyproject.toml declares as package data.
        (src / "MANIFEST.in").write_text(
            "".join(f"graft {p}\n" for p in PROJECT_PACKAGES if (src / p).is_dir())
            + "global-exclude *.pyc\nprune **/__pycache__\n")
        r = _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(src))
        if r.returncode != 0:
            raise ImageError(f"building the envfactory wheel failed:\n{r.stderr[-2000:]}")


def _build(client: Any, tag: str, digest: str, extras: dict[str, Path], requirements: list[str] | None = None) -> None:
    import docker

    with tempfile.TemporaryDirectory(prefix="envf-ctx-") as tmp:
        ctx = Path(tmp)
        for d in ("deps", "reqs", "project", "extra"):
            (ctx / d).mkdir()
        _download_deps(ctx / "deps", runtime_requirements())
        layer = ""
        if requirements:
            _download_deps(ctx / "reqs", requirements)
            layer = "COPY reqs /wheels/reqs\nRUN pip install -q --no-index --no-deps /wheels/reqs/*.whl\n"
        _build_project_wheel(ctx / "project")
        for mod, path in extras.items():
            shutil.copy2(path, ctx / "extra" / f"{mod}.py")
        (ctx / "Dockerfile").write_text(_DOCKERFILE.format(base=BASE_IMAGE, hash=digest, requirements=layer))
        try:
            client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="none")
        except docker.errors.BuildError as exc:
            log = "".join(str(c.get("stream", c.get("error", ""))) for c in exc.build_log)
            raise ImageError(f"docker build of {tag} failed: {exc}\n{log[-3000:]}") from None


def image_for(specs: Iterable[Any], *, client: Any = None, rebuild: bool = False) -> tuple[str, bool]:
    """The image that serves ``specs``, built if it does not exist yet.

    Returns:
        ``(tag, built)``: ``built`` is false when an image with this content
        hash already existed.
    """
    import docker

    specs = list(specs)
    client = client or docker.from_env()
    extras = extra_modules(specs)
    requirements = image_requirements(specs)
    key = ",".join(sorted(extras)) + "|" + ",".join(requirements)
    with _lock:
        if not rebuild and key in _built:
            return _built[key], False
        digest = content_hash(client, extras, requirements)
        tag = f"{IMAGE_REPO}:{digest}"
        built = False
        try:
            if rebuild:
                raise docker.errors.ImageNotFound(tag)
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            _build(client, tag, digest, extras, requirements)
            built = True
        _built[key] = tag
        return tag, built


def build_images(specs: list[Any], *, rebuild: bool = False) -> list[dict[str, Any]]:
    """Build (or find) the image of each spec; the ``envfactory image build`` rows."""
    import time

    rows = []
    for s in specs:
        t0 = time.perf_counter()
        tag, built = image_for([s], rebuild=rebuild)
        rebuild = False  # one rebuild per image content, not per environment
        rows.append({"name": s.name, "image": tag, "built": built,
                     "seconds": round(time.perf_counter() - t0, 2)})
    return rows

