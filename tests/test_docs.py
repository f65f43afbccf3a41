"""Every Python snippet of the README and the manual (docs/*.md) runs, and every name and link they
(and benchmarks/results/RESULTS.md) give exists.

The rule for snippets (fenced blocks whose info string starts with ``python``):

* ```` ```python ```` blocks of one page run in order, in one namespace per page, the way a
  reader goes through the page (a later block may use what an earlier one defined). Each page
  starts from a fresh namespace, in a fresh temporary working directory.
* ```` ```python slow ```` blocks (training) run alone, each in a fresh namespace, as tests
  marked ``slow``; they must be self-contained.
* ```` ```python no-run ```` blocks are not run. Keep them for what cannot run offline on a
  CPU (a GPU, a served endpoint, a Docker engine); the page's text says why, and
  :data:`MAX_NO_RUN` bounds how many there are.
* Other fences (```` ```bash ````, ```` ```yaml ````, ...) are not run.

The README stays a front page: at most 150 lines, a code block within its first 40, no table
(figures live in benchmarks/results/RESULTS.md), and links that resolve.

Besides the snippets: relative links point at files that exist, every repository path in
backquotes (``envfactory/faces/gym_env.py``) exists, and every dotted name in backquotes that
starts with a package of this repository (``envfactory.checks.audit``,
``envfactory.parsing.MAX_ACTION_CHARS``) names a module, or a name defined at the top of one.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "results" / "RESULTS.md"]
TAGS = {"": "run", "slow": "slow", "no-run": "no-run"}
MAX_NO_RUN = 6
PACKAGES = ("envfactory", "agents", "benchmarks", "environments", "tools")
FOLDERS = ("envfactory", "agents", "benchmarks", "environments", "tools", "examples", "tests", "scripts", "docs")

FENCE = re.compile(r"^```(\S*)[ \t]*(.*?)\s*$")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the block's first code line in the page
    tag: str   # "run", "slow" or "no-run"
    code: str

    @property
    def where(self) -> str:
        return f"{_rel(self.page)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, in order; an unknown tag after ``python`` is an error."""
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        lang, tag = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{_rel(page)}:{i + 1}: a ``` fence is never closed")
        if lang == "python":
            if tag not in TAGS:
                raise AssertionError(f"{_rel(page)}:{i + 1}: unknown tag {tag!r} on a python block; "
                                     f"use one of {sorted(t for t in TAGS if t)} or none")
            out.append(Block(page, i + 2, TAGS[tag], "\n".join(lines[i + 1:end])))
        i = end + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]


def run(block_list: list[Block], namespace: dict) -> None:
    for b in block_list:
        # padded so that a traceback names the page's own line numbers
        code = compile("\n" * (b.line - 1) + b.code, str(b.page), "exec")
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(f"the snippet at {b.where} failed: {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.page == p and b.tag == "run" for b in ALL)],
                         ids=lambda p: p.name)
def test_page_snippets_run_in_order(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run([b for b in ALL if b.page == page and b.tag == "run"], {"__name__": f"docs_{page.stem}"})


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in ALL if b.tag == "slow"], ids=lambda b: b.where)
def test_slow_snippet_runs_alone(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    run([block], {"__name__": "docs_slow"})


def test_snippets_exist_and_few_are_not_run() -> None:
    assert (ROOT / "README.md") in {b.page for b in ALL}, "the README's tour is no longer a python block"
    no_run = [b.where for b in ALL if b.tag == "no-run"]
    assert len(no_run) <= MAX_NO_RUN, f"{len(no_run)} snippets are not run (at most {MAX_NO_RUN}): {no_run}"
    assert len(ALL) - len(no_run) >= 10, "most snippets should run"


def test_the_extractor_sees_tags_and_refuses_unknown_ones(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n```python\nx = 1\n```\n```bash\nls\n```\n```python slow\ny = 2\n```\n"
                    "```python no-run\nz = 3\n```\n")
    found = [(b.line, b.tag, b.code) for b in blocks(page)]
    assert found == [(3, "run", "x = 1"), (9, "slow", "y = 2"), (12, "no-run", "z = 3")]
    page.write_text("```python maybe\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="unknown tag"):
        blocks(page)


def test_a_failing_snippet_names_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n```python\nraise ValueError('nope')\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:6 failed: ValueError: nope"):
        run(blocks(page), {})


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*?)\s*$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_files(page: Path) -> None:
    missing = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            missing.append(target)
    assert not missing, f"{_rel(page)} links to files or headings that do not exist: {missing}"


CODE = re.compile(r"`([^`\n]+)`")
# a file (it has an extension); `envfactory/reward` is an MCP _meta key, not a path
PATH = re.compile(r"^(?:%s)/[\w./-]*\.\w+$" % "|".join(FOLDERS))
DOTTED = re.compile(r"^(?:%s)(?:\.[A-Za-z_]\w*)+$" % "|".join(PACKAGES))


# entry-point groups (`envfactory.environments`) read like modules but are not
GROUPS = set(re.findall(r'entry-points\."([\w.]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8")))


def _defined(module: str, name: str) -> bool:
    """Whether ``name`` is defined at the top level of ``module`` (read, not imported: some
    modules import torch or vLLM)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    src = Path(spec.origin).read_text(encoding="utf-8")
    return re.search(rf"^(?:def |class |async def )?{re.escape(name)}\b|^from \S+ import .*\b{re.escape(name)}\b"
                     rf"|^\s+\"{re.escape(name)}\":", src, re.M) is not None


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            rest = parts[k:]
            # a module, or a module's name (and its attribute, e.g. a class's method: not checked)
            return not rest or _defined(module, rest[0])
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_paths_and_modules_exist(page: Path) -> None:
    bad = []
    for text in CODE.findall(page.read_text(encoding="utf-8")):
        words = re.split(r"[\s(),\[\]=:]+", text)
        for word in words:
            word = word.rstrip(".")
            if PATH.match(word) and "*" not in word and "<" not in word:
                if not (ROOT / word.split("::")[0]).exists():
                    bad.append(word)
            elif DOTTED.match(word) and word not in GROUPS and not _resolves(word):
                bad.append(word)
    assert not bad, f"{_rel(page)} names paths or modules that do not exist: {sorted(set(bad))}"


def test_anchors_follow_githubs_rule(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## The engine: one referee, N ≥ 1 roles\n\n### Task kinds: worth it\n")
    assert anchors(page) == {"title", "the-engine-one-referee-n--1-roles", "task-kinds-worth-it"}


README = ROOT / "README.md"


def test_the_readme_is_a_front_page() -> None:
    """The README is a front page (what, install, a short example, links), as Gymnasium's is:
    short, a code block near the top, no tables of figures (those live in
    benchmarks/results/RESULTS.md and the manual), and every relative link it gives resolves."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150): move detail into docs/"
    first = next((i for i, line in enumerate(lines) if line.startswith("```")), None)
    assert first is not None and first < 40, \
        f"README.md's first code block starts at line {first and first + 1} (it should within the first 40)"
    rows, fence = [], False
    for i, line in enumerate(lines, 1):
        fence ^= line.startswith("```")
        if not fence and line.lstrip().startswith("|"):
            rows.append(i)
    assert not rows, f"README.md has markdown table rows at lines {rows}: figures go to benchmarks/results/RESULTS.md"
    for target in LINK.findall("\n".join(lines)):
        if re.match(r"[a-z]+:", target):
            continue
        file = target.partition("#")[0]
        assert file and (ROOT / file).is_file(), f"README.md links to {target!r}, which is not a file of the repository"
