"""The command line: one way to add commands (built-ins and entry points), errors on stderr with a
non-zero exit, did-you-mean, bad ports, examples in every --help, progress on stderr, --json purity."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import envfactory
from envfactory import cli

ROOT = Path(__file__).resolve().parents[1]


def _py(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


# -- --json: only the JSON document on stdout --------------------------------------
_NOISY = """
    import logging, os, subprocess, sys
    from envfactory import cli

    log = logging.getLogger("noisy-library")
    log.addHandler(logging.StreamHandler(sys.stdout))  # a library that captured sys.stdout at import
    log.setLevel(logging.INFO)

    def run(args):
        print("INFO a python print")
        log.info("INFO a logging line")
        os.write(1, b"INFO a C-level write to fd 1\\n")
        subprocess.run(["echo", "INFO a child process"], check=True)
        sys.stdout.write("INFO no newline")
        return 0, {"ok": True, "n": 3}, "human text"

    NOISE = cli.Command("prints noise", lambda p: None, run)
    cli.BUILTIN_COMMANDS["noise"] = "__main__:NOISE"  # named as any command is: module:ATTRIBUTE
    sys.exit(cli.main(sys.argv[1:]))
"""


def test_json_mode_prints_only_json_on_stdout():
    r = _py(_NOISY, "noise", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ok": True, "n": 3}
    for noise in ("a python print", "a logging line", "a C-level write", "a child process", "no newline"):
        assert noise in r.stderr and noise not in r.stdout
    # without --json the human text goes to stdout as before
    r = _py(_NOISY, "noise")
    assert r.returncode == 0 and "human text" in r.stdout and "a C-level write" in r.stdout


def test_list_json_is_clean():
    r = subprocess.run([sys.executable, "-m", "envfactory.cli", "list", "--json"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {"FileSystem-v0", "MultiRecords-v0"} <= {row["name"] for row in rows}


# -- list: columns as wide as the data -----------------------------------------------
class _FakeSpec:
    def __init__(self, name, domain, multi, tasks, tools, description):
        self.row = {"name": name, "domain": domain, "multi_agent": multi, "tasks": tasks, "tools": tools,
                    "description": description}

    def describe(self):
        return dict(self.row)


def test_list_columns_fit_long_names(monkeypatch, capsys):
    fakes = [
        _FakeSpec("A-v0", "x", False, 5, 3, "short"),
        _FakeSpec("AVeryLongEnvironmentNameIndeed-v0", "an-exceptionally-long-domain-name", True, 12345, 7, "long"),
        _FakeSpec("B-v0", "mid-domain", False, 50, 12, "mid"),
    ]
    monkeypatch.setattr(envfactory, "specs", lambda: fakes)
    from envfactory.cli.environments import LIST

    code, rows, text = LIST.run(None)
    assert code == 0 and [r["name"] for r in rows] == ["A-v0", "AVeryLongEnvironmentNameIndeed-v0", "B-v0"]
    header, *lines = text.splitlines()
    start = {col: header.index(col) for col in ("domain", "agents", "description")}
    end = {col: header.index(col) + len(col) for col in ("tasks", "tools")}
    for line, fake in zip(lines, fakes):
        r = fake.row
        assert line.index(r["domain"], start["domain"]) == start["domain"], (header, line)
        agents = "multi" if r["multi_agent"] else "single"
        assert line[start["agents"]:].startswith(agents), (header, line)
        assert line[start["description"]:] == r["description"], (header, line)
        assert line[: end["tasks"]].endswith(str(r["tasks"])), (header, line)  # numbers right-aligned
        assert line[: end["tools"]].endswith(str(r["tools"])), (header, line)
        assert line[end["tasks"]] == " " and line[start["agents"] - 1] == " "  # columns never touch


# -- commands from other packages ------------------------------------------------------
def test_agents_commands_come_from_the_entry_point_group():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group=cli.COMMAND_GROUP)}
    assert {"eval", "train", "quickstart"} <= set(eps), "pip install -e . --no-deps registers the entry points"
    assert all(v.startswith("agents.") for v in eps.values())
    assert not {"eval", "train", "quickstart"} & set(cli.BUILTIN_COMMANDS)  # the core does not define them


def test_help_works_without_torch():
    r = _py("""
        import sys
        for m in ("torch", "transformers", "vllm"):
            sys.modules[m] = None  # importing it raises ImportError
        from envfactory.cli import main
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        print("AGENTS-LOADED" if "agents.cli_commands" in sys.modules else "AGENTS-MISSING")
    """)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for name in ("list", "verify", "eval", "train", "quickstart"):
        assert f"    {name}" in r.stdout
    assert "AGENTS-LOADED" in r.stdout


def test_train_without_torch_is_a_clear_error(tmp_path):
    config = tmp_path / "train.json"
    config.write_text('{"envs": ["Counter-v0"], "steps": 1}')
    r = _py("""
        import sys
        for m in ("torch", "transformers"):
            sys.modules[m] = None  # importing it raises ImportError
        from envfactory.cli import main
        sys.exit(main(sys.argv[1:]))
    """, "train", "--config", str(config), "--json")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, r.stderr
    error = json.loads(r.stdout)["error"]
    assert "'train' command" in error and "not installed" in error and "torch" in error


class _EP:
    def __init__(self, name, value, load):
        self.name, self.value, self.group = name, value, cli.COMMAND_GROUP
        self._load = load

    def load(self):
        return self._load()


def _fake_plugins(monkeypatch, eps):
    real = metadata.entry_points

    def entry_points(*, group=None, **kw):
        return list(eps) if group == cli.COMMAND_GROUP else real(group=group, **kw)

    monkeypatch.setattr(metadata, "entry_points", entry_points)


def _needs_missing_module(args):
    import envfactory_missing_dependency_xyz  # noqa: F401

    return 0, {}, ""


def test_broken_plugins_give_clear_errors(monkeypatch, capfd):
    def boom():
        raise ImportError("No module named 'torch'")

    def percent():
        raise RuntimeError("100% broken")  # help strings are %-formats: this must not break --help

    ok = cli.Command("works", lambda p: p.add_argument("--n", type=int, default=1),
                     lambda a: (0, {"n": a.n}, f"n={a.n}"))
    bad_args = cli.Command("bad arguments", lambda p: 1 / 0, lambda a: (0, {}, ""))
    _fake_plugins(monkeypatch, [
        _EP("good", "pkg:GOOD", lambda: ok),
        _EP("triple", "pkg:TRIPLE", lambda: ("a triple", lambda p: None, lambda a: (0, {"t": 1}, "t"))),
        _EP("unimportable", "pkg.needs_torch:CMD", boom),
        _EP("malformed", "pkg:NOT_A_COMMAND", lambda: 42),
        _EP("percent", "pkg:PERCENT", percent),
        _EP("list", "pkg:LIST", lambda: ok),  # clashes with a built-in command
        _EP("badargs", "pkg:BADARGS", lambda: bad_args),
        _EP("needsdep", "pkg:NEEDSDEP", lambda: cli.Command("needs a dependency", lambda p: None,
                                                            _needs_missing_module)),
    ])
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    help_text = capfd.readouterr().out
    assert "unavailable: ImportError: No module named 'torch'" in help_text
    assert "good" in help_text and "triple" in help_text and "100% broken" in help_text

    assert cli.main(["good", "--n", "4", "--json"]) == 0
    assert json.loads(capfd.readouterr().out) == {"n": 4}
    assert cli.main(["triple"]) == 0 and capfd.readouterr().out.strip() == "t"

    for argv, fragment in ((["unimportable", "--whatever"], "No module named 'torch'"),
                           (["malformed"], "expected an envfactory.cli.Command"),
                           (["percent"], "RuntimeError: 100% broken"),
                           (["badargs"], "adding its arguments failed: ZeroDivisionError"),
                           (["needsdep"], "needs a module that is not installed")):
        assert cli.main(argv) == 2, argv
        out = capfd.readouterr()
        assert fragment in out.err and not out.out and "Traceback" not in out.err, (argv, out)
        assert cli.main([*argv, "--json"]) == 2
        out = capfd.readouterr()
        assert fragment in json.loads(out.out)["error"] and fragment in out.err

    # the built-in command wins over a plugin of the same name
    assert cli.main(["list", "--json"]) == 0
    assert isinstance(json.loads(capfd.readouterr().out), list)


def test_a_failing_bench_section_never_empties_the_report(monkeypatch):
    """Each section runs on its own: one that raises reports ``<section>_error``; the others' figures stay."""
    from envfactory.cli import bench

    sections = {"first": lambda: {"first_step_us": 1.5}, "broken": lambda: 1 / 0,
                "last": lambda: {"last_ratio": 2.0}}
    monkeypatch.setattr(bench, "installed_sections", lambda: sections)
    doc = bench.run_bench()
    assert doc["first_step_us"] == 1.5 and doc["last_ratio"] == 2.0
    assert doc["broken_error"].startswith("ZeroDivisionError")
    assert {"section_first_s", "section_broken_s", "section_last_s"} <= set(doc)
    assert bench.run_bench(["last"]).keys() == {"last_ratio", "section_last_s"}


def test_bench_sections_come_from_the_benchmarks_package():
    from envfactory.cli import bench

    known = bench.installed_sections()
    assert {"step", "fork", "bigstate", "docker", "scale", "rollout", "openenv"} <= set(known)
