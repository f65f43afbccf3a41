"""The command line: one way to add commands (built-ins and entry points), errors on stderr with a
non-zero exit, did-you-mean, bad ports, examples in every --help, progress on stderr, --json purity."""

from __future__ import annotations

import io
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
    monkeypatch.setattr(envfactory.registry, "listing", lambda **kw: [f.describe() for f in fakes])
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

    for argv, fragment in ((["unimportable", "--whatever"], "No module named 'torch'"),
                           (["malformed"], "expected an envfactory.cli.Command"),
                           (["triple"], "expected an envfactory.cli.Command"),  # one way: a Command
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
    from envfactory.cli import measure as bench

    sections = {"first": lambda: {"first_step_us": 1.5}, "broken": lambda: 1 / 0,
                "last": lambda: {"last_ratio": 2.0}}
    monkeypatch.setattr(bench, "installed_sections", lambda: sections)
    doc = bench.run_bench()
    assert doc["first_step_us"] == 1.5 and doc["last_ratio"] == 2.0
    assert doc["broken_error"].startswith("ZeroDivisionError")
    assert {"section_first_s", "section_broken_s", "section_last_s"} <= set(doc)
    assert bench.run_bench(["last"]).keys() == {"last_ratio", "section_last_s", "bench_machine", "bench_load_1m"}
    assert len(doc["bench_load_1m"]) == 2  # at the start and at the end
    assert doc["bench_machine"]["cpus"] >= 1 and isinstance(doc["bench_machine"]["cpu"], str)


def test_bench_sections_come_from_the_benchmarks_package():
    from envfactory.cli import measure as bench

    known = bench.installed_sections()
    assert {"step", "fork", "bigstate", "docker", "scale", "rollout", "openenv"} <= set(known)


# -- one way to add a command -----------------------------------------------------------
def test_every_builtin_is_a_command_found_without_installed_metadata(monkeypatch, capfd):
    """The core's commands are named like entry points and load the same way, with or without the
    package's installed metadata; serve declares both protocols itself."""
    _fake_plugins(monkeypatch, [])  # no entry points at all: a checkout on PYTHONPATH
    table = cli.commands()
    assert list(table) == list(cli.BUILTIN_COMMANDS)
    for name, (cmd, source) in table.items():
        assert type(cmd) is cli.Command, (name, cmd)  # a real command, not the stand-in for a broken one
        assert source == f"built-in {cli.BUILTIN_COMMANDS[name]}"
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--protocol {mcp,openenv}" in capfd.readouterr().out


def test_running_one_command_builds_only_its_arguments():
    r = _py("""
        import sys
        from envfactory.cli import main
        code = main(["list", "--json"])
        heavy = [m for m in ("agents.quickstart.experiment", "envfactory.faces.mcp_server", "envfactory.faces.openenv_server",
                             "envfactory.evaluation.eval", "envfactory.factory.from_prompt") if m in sys.modules]
        print("HEAVY", heavy, file=sys.stderr)
        sys.exit(code)
    """)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stderr
    assert isinstance(json.loads(r.stdout), list)


# -- errors: stderr, a non-zero exit, and --json stays one JSON document ------------------------
@pytest.mark.parametrize("argv, fragment", [
    (["verify", "Nope-v0"], "no environment named 'Nope-v0'"),
    (["tasks", "synth", "Nope-v0", "--n", "1"], "no environment named 'Nope-v0'"),
    (["image", "build"], "name the environments"),
    (["generate", "--from-prompt", "x"], "--from-prompt needs --llm-url and --model"),
    (["serve", "Nope-v0", "--protocol", "mcp"], "no environment named 'Nope-v0'"),
    (["eval-team", "Counter-v0", "--policies", "noop"], "single-agent"),
    (["serve", "Bank-v0", "--runtime", "nope"], "no runtime 'nope'; the runtimes: local, docker"),
    (["verify", "Counter-v0", "--runtime", "nope"], "no runtime 'nope'; the runtimes: local, docker"),
    (["serve", "Bank-v0", "--runtime", "nope", "--protocol", "openenv", "--port", "0"], "no runtime 'nope'"),
    (["tasks", "synth", "Counter-v0", "--n", "-1"], "--n must be 1 or more (got -1)"),
    (["tasks", "synth", "Counter-v0", "--n", "0"], "--n must be 1 or more (got 0)"),
])
def test_errors_go_to_stderr_with_a_nonzero_exit(argv, fragment, capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # eval-team must not leave a report behind
    assert cli.main(argv) == 2
    out = capfd.readouterr()
    assert out.out == "", out.out
    assert f"envfactory {argv[0]}: error: " in out.err and fragment in out.err and "Traceback" not in out.err
    assert cli.main([*argv, "--json"]) == 2
    out = capfd.readouterr()
    assert fragment in json.loads(out.out)["error"]  # stdout: the JSON document and nothing else
    assert fragment in out.err


def test_tasks_synth_says_a_shortfall_on_stderr(monkeypatch, capfd):
    """Fewer tasks than asked for: the tasks found are the output (stdout), the shortfall an error on
    stderr, exit 1."""
    from envfactory.factory.tasks import synthesis as tasks_synth

    real = tasks_synth.synthesize_for
    monkeypatch.setattr(tasks_synth, "synthesize_for", lambda spec, n, seed: real(spec, n=1, seed=seed))
    assert cli.main(["tasks", "synth", "Counter-v0", "--n", "3"]) == 1
    out = capfd.readouterr()
    assert "1 tasks for Counter-v0" in out.out and "error" not in out.out
    assert "envfactory tasks: error: 1 of the 3 tasks asked for could be synthesized for Counter-v0" in out.err
    assert cli.main(["tasks", "synth", "Counter-v0", "--n", "3", "--json"]) == 1
    out = capfd.readouterr()
    assert len(json.loads(out.out)) == 1 and "1 of the 3 tasks" in out.err


def test_an_unexpected_exception_is_one_error_line_on_stderr(monkeypatch, capfd):
    """Whatever a command raises (here: an OSError from deep inside, as a bad model path or report folder
    gives) is one 'envfactory CMD: error:' line on stderr and exit 1, never a bare traceback; with --json
    stdout is still one {"error": ...} document; ENVFACTORY_TRACEBACK=1 adds the traceback."""
    from envfactory.cli import environments

    def boom(args):
        raise OSError("[Errno 2] No such file or directory: '/proc/nope'")

    monkeypatch.setattr(environments, "LIST", environments.LIST._replace(run=boom))
    monkeypatch.setitem(cli.BUILTIN_COMMANDS, "list", "envfactory.cli.environments:LIST")
    assert cli.main(["list"]) == 1
    out = capfd.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    assert "envfactory list: error: [Errno 2] No such file or directory: '/proc/nope' (OSError;" in out.err
    assert cli.main(["list", "--json"]) == 1
    out = capfd.readouterr()
    assert "/proc/nope" in json.loads(out.out)["error"] and "Traceback" not in out.err
    monkeypatch.setenv("ENVFACTORY_TRACEBACK", "1")
    assert cli.main(["list"]) == 1
    out = capfd.readouterr()
    assert "Traceback" in out.err and "envfactory list: error:" in out.err and out.out == ""


def test_a_bad_spec_file_is_named_once(tmp_path, capfd):
    path = tmp_path / "bomb.yaml"
    path.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n"
                    + "".join(f"{c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdef", "bcdefg"))
                    + "name: Bomb-v0\n")
    assert cli.main(["generate", "--from-spec", str(path)]) == 2
    err = capfd.readouterr().err
    assert f"envfactory generate: error: {path}: the YAML expands to more than" in err and err.count(str(path)) == 1


def test_unrecognized_arguments_are_said_by_the_command(capfd):
    """An argument the command does not take: its own usage and name, not the top level's."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["play", "Nope-v0"])
    out = capfd.readouterr()
    assert exc.value.code == 2 and not out.out
    assert "usage: envfactory play" in out.err and "Traceback" not in out.err
    assert "envfactory play: error: unrecognized arguments: Nope-v0 ('envfactory play --help'" in out.err


def test_train_overrides_reach_the_config(capfd, tmp_path):
    """``train --device/--steps/--output-dir`` change the config it runs (--print-config shows it)."""
    argv = ["train", "--print-config", "--device", "cuda:1", "--steps", "3", "--output-dir", str(tmp_path), "--json"]
    assert cli.main(argv) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["device"] == "cuda:1" and doc["steps"] == 3 and doc["output"]["dir"] == str(tmp_path)


def test_unknown_names_suggest_the_closest_instead_of_listing_all(monkeypatch, capfd):
    assert cli.main(["verify", "Bnak-v0"]) == 2
    err = capfd.readouterr().err
    assert "did you mean 'Bank-v0'" in err and "FileSystem-v0" not in err  # no dump of every name
    assert cli.main(["verify", "bank-v0"]) == 2  # only the case is wrong: just that one
    assert "did you mean 'Bank-v0'?" in capfd.readouterr().err
    assert cli.main(["verify", "Zzzzzzzzz"]) == 2
    assert "did you mean" not in capfd.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["verfy", "Bank-v0"])
    assert exc.value.code == 2 and "no command 'verfy'; did you mean 'verify'?" in capfd.readouterr().err

    first = envfactory.spec("Bank-v0").get_tasks()[0].id
    typo = first[0] + first[2] + first[1] + first[3:]  # two letters swapped
    with pytest.raises(KeyError, match=f"did you mean '{first}'"):
        envfactory.spec("Bank-v0").task(typo)

    from envfactory.cli import measure as bench

    monkeypatch.setattr(bench, "installed_sections", lambda: {"fork": dict, "step": dict, "docker": dict})
    assert cli.main(["bench", "--only", "forkk", "--json"]) == 2
    out = capfd.readouterr()
    assert "did you mean 'fork'?" in json.loads(out.out)["error"] and "did you mean 'fork'?" in out.err


# -- serve: ports ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["99999", "-1", "http"])
def test_serve_rejects_a_port_out_of_range(bad, capfd):
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "Bank-v0", "--transport", "streamable-http", f"--port={bad}"])
    assert exc.value.code == 2
    out = capfd.readouterr()
    assert "argument --port" in out.err and "0-65535" in out.err and "Traceback" not in out.err and not out.out


@pytest.mark.parametrize("argv, fragment", [
    (["serve", "Bank-v0", "--port", "99999"], "argument --port: 99999 is not a port number"),
    (["verfy", "Bank-v0"], "no command 'verfy'; did you mean 'verify'?"),
    (["play", "Nope-v0"], "unrecognized arguments: Nope-v0"),
    (["tasks", "synth"], "the following arguments are required: name"),
])
def test_usage_errors_under_json_are_one_json_document_too(argv, fragment, capfd):
    """A usage error (argparse's) with --json: stdout is ``{"error": ...}`` as for any other error;
    stderr has the usage and the message; the exit code is 2."""
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--json"])
    out = capfd.readouterr()
    assert exc.value.code == 2 and fragment in json.loads(out.out)["error"]
    assert fragment in out.err and "usage: envfactory" in out.err
    with pytest.raises(SystemExit):
        cli.main(argv)  # without --json: nothing on stdout
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize("protocol", [["--protocol", "mcp", "--transport", "streamable-http"],
                                      ["--protocol", "openenv"]])
def test_serve_on_a_busy_port_is_a_clear_error(protocol, capfd):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["serve", "Bank-v0", *protocol, "--port", str(port)]) == 2
    out = capfd.readouterr()
    assert f"cannot listen on 127.0.0.1:{port}" in out.err and "in use" in out.err and not out.out


# -- --help: an example for every command ----------------------------------------------------
def test_every_command_help_shows_an_example(capfd):
    for argv in [[], *([name] for name in cli.commands()), ["tasks", "synth"]]:
        with pytest.raises(SystemExit) as exc:
            cli.main([*argv, "--help"])
        assert exc.value.code == 0, argv
        text = capfd.readouterr().out
        assert "Examples:\n  envfactory " in text, (argv, text[-300:])
        if argv:
            assert f"envfactory {' '.join(argv)}" in text.split("Examples:")[1], argv


# -- progress: tqdm on stderr, only on a terminal -------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_verify_shows_progress_on_a_terminal_and_json_stays_pure(monkeypatch, capsys):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["verify", "Counter-v0", "--no-audit", "--workers", "1"]) == 0
    assert "verify" in terminal.getvalue() and "1/1" in terminal.getvalue()
    assert capsys.readouterr().out.startswith("PASS  Counter-v0")

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal (a log file, a pipe): no bar
    assert cli.main(["verify", "Counter-v0", "--no-audit", "--workers", "1", "--json"]) == 0
    assert "1/1" not in sys.stderr.getvalue()
    assert json.loads(capsys.readouterr().out)["totals"]["verified"] == 1


def test_training_progress_is_a_tqdm_bar_on_stderr(monkeypatch):
    import time

    from agents.metrics import progress

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    started = time.perf_counter() - 4
    for i in range(1, 4):
        progress("rl", i, 3, started, success=0.5)
    shown = terminal.getvalue()
    assert "rl: 100%" in shown and "3/3" in shown and "success=0.5" in shown and "00:04" in shown


def test_a_cold_listing_built_in_worker_processes_equals_one_built_here(tmp_path, monkeypatch):
    """A cold `envfactory list` builds its entries in spawned worker processes
    (``ENVFACTORY_LIST_WORKERS``); the rows are those built in one process, and the cache they
    leave (with the workers' source files) makes the next listing warm."""
    from envfactory import registry

    names = ["Counter-v0", "Bank-v0", "FindLight-v1", "RetailOrders-v0", "Library-v0", "Telecom-v0"]
    monkeypatch.setenv("ENVFACTORY_CACHE", str(tmp_path))
    monkeypatch.setenv("ENVFACTORY_LIST_WORKERS", "2")
    r = _py("""
        import json, sys
        from envfactory import registry
        registry.LISTING_MIN_PER_WORKER = 3
        used = []
        real = registry._describe_elsewhere
        registry._describe_elsewhere = lambda names, workers: (used.append(workers), real(names, workers))[1]
        rows = registry.listing(sys.argv[1:])
        print(json.dumps({"rows": rows, "workers": used, "here": [n for n in sys.argv[1:] if n in registry._REGISTRY
                                                                  and registry._REGISTRY[n]._tasks is not None]}))
    """, *names)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["workers"] == [2] and out["here"] == []  # built elsewhere, none in the listing process
    monkeypatch.setenv("ENVFACTORY_LIST_WORKERS", "1")
    assert registry.listing(names, cache=False) == out["rows"]
    doc = json.loads(registry.listing_cache_path().read_text()) if registry.listing_cache_path().exists() else None
    if doc is not None:  # (the subprocess's cache key matches this process's when sys.path does)
        assert set(names) - {"Counter-v0", "Bank-v0"} <= set(doc["envs"])
    monkeypatch.setenv("ENVFACTORY_LIST_WORKERS", "nope")
    with pytest.raises(ValueError, match="ENVFACTORY_LIST_WORKERS"):
        registry._listing_workers(20)
