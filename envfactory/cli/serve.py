"""``envfactory serve NAME``: an environment served to any client, over MCP or OpenEnv's protocol."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import socket
import sys

from . import Command, CommandError, Result, check_runtime

# what each protocol's server module is; both read the arguments declared below
PROTOCOLS = {"mcp": "envfactory.faces.mcp_server", "openenv": "envfactory.faces.openenv_server"}


def port(text: str) -> int:
    """An argparse type: a TCP port number, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535; 0: any free port)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number: ports are 0-65535 (0: any free port)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return value


def _serve_args(p: argparse.ArgumentParser) -> None:
    from ..definition import DEFAULT_SPLIT, DRAW_SPLITS
    from ..faces.guard import DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BODY

    p.add_argument("name", help="the environment to serve (a registered single-agent environment)")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default="mcp",
                   help="mcp: Model Context Protocol (default); openenv: openenv-core's server (HTTP + "
                        "WebSocket at --host/--port; --transport is not used)")
    p.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio",
                   help="mcp: stdio (default; one client, the parent process) or streamable-http")
    p.add_argument("--host", default="127.0.0.1", help="streamable-http and openenv: the address to listen on")
    p.add_argument("--port", type=port, default=8000,
                   help="streamable-http and openenv: the port (0: any free port)")
    p.add_argument("--runtime", default="local", help="where worlds run: local or docker")
    p.add_argument("--task", default=None, help="default task of start_episode (and of a first tool call)")
    p.add_argument("--seed", type=int, default=None, help="default seed (picks the task as reset(seed=...) does)")
    p.add_argument("--split", default=DEFAULT_SPLIT, choices=list(DRAW_SPLITS),
                   help="the tasks served (default train: sft and rl; evaluation tasks only when asked for; "
                        "seen / heldout-family / heldout-kind / heldout-phrasing: see docs/training.md)")
    p.add_argument("--max-turns", type=int, default=None, help="override the environment's turn limit")
    p.add_argument("--max-episodes", type=int, default=256,
                   help="live episodes (sessions) at once; beyond it a new one is refused with an error (a "
                        "finished one may be released for it; another client's live one never is)")
    p.add_argument("--max-episodes-per-client", type=positive_int, default=None,
                   help="live episodes (sessions) one client may hold at once (default: an equal share of "
                        "--max-episodes among the tokens; all of it with one token or none); a "
                        "client is a token of --token (give each client its own), else one transport session")
    p.add_argument("--token", default=None,
                   help="streamable-http and openenv: every request must carry it ('Authorization: Bearer "
                        "TOKEN'; else 401); several, comma-separated: each is one client, kept to its own "
                        "episodes. Default: $ENVFACTORY_TOKEN (preferred: argv is visible to others); "
                        "required beyond loopback")
    p.add_argument("--allow-no-token", action="store_true",
                   help="serve on a non-loopback --host without a token (a trusted network, or a proxy that "
                        "authenticates)")
    p.add_argument("--max-body", type=positive_int, default=DEFAULT_MAX_BODY,
                   help="streamable-http and openenv: largest request body and WebSocket message, in bytes "
                        "(default 4 MiB; larger: 413, or the WebSocket closes with 1009)")
    p.add_argument("--idle-timeout", type=float, default=None,
                   help=f"seconds a session may go without a request before it is closed and its world "
                        f"released (default {DEFAULT_IDLE_TIMEOUT:g}; over stdio, whose one client is the parent "
                        "process: never; 0: never); a later request is a 'session expired' error")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="streamable-http and openenv: serve HTTPS / WSS with this certificate (and --tls-key), "
                        "so the token does not travel in the clear")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    p.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT,
                   help=f"streamable-http and openenv: seconds a request's line and headers may take to arrive "
                        f"(default {DEFAULT_HEADER_TIMEOUT:g}); slower: 408 and the connection closes")
    p.add_argument("--max-session-time", type=float, default=None,
                   help="seconds a session may last however busy (default: no limit); then it is closed as an "
                        "idle one is, so no client holds a session (and its world) for ever")


def check_listen(host: str, port: int) -> None:
    """Raise :class:`CommandError` unless a server can listen on ``host:port`` now (a busy port,
    an address this machine does not have, a port that needs privileges): said before the
    environment is built, not as a traceback from deep inside the server."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            sock.bind((host, port))
    except OSError as exc:
        why = {errno.EADDRINUSE: "the port is in use (another server?); pick another --port, or 0 for any free one",
               errno.EACCES: "permission denied (ports below 1024 need privileges); pick a port above 1023",
               errno.EADDRNOTAVAIL: "this machine has no such address; try --host 127.0.0.1 or 0.0.0.0",
               }.get(exc.errno or 0, exc.strerror or str(exc))
        raise CommandError(f"cannot listen on {host}:{port}: {why}") from None


def _serve_run(args: argparse.Namespace) -> Result:
    from ..registry import spec

    try:
        spec(args.name)  # first: its module may add a runtime (importing from_mcp adds "mcp")
    except KeyError as exc:
        raise CommandError(str(exc.args[0]) if exc.args else str(exc)) from None
    check_runtime(args.runtime)  # else the server would start and fail at its first episode
    if args.protocol == "openenv" or args.transport != "stdio":
        from ..faces.guard import check_exposure, resolve_token

        try:
            check_exposure(args.host, resolve_token(args.token), args.allow_no_token)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        check_listen(args.host, args.port)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CommandError("TLS needs both --tls-cert and --tls-key")
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not os.path.isfile(path):
            raise CommandError(f"no such file: {path}")
    if args.max_session_time is not None and args.max_session_time <= 0:
        raise CommandError("--max-session-time must be a number of seconds above 0")
    if args.header_timeout <= 0:
        raise CommandError("--header-timeout must be a number of seconds above 0")
    if args.idle_timeout is not None and args.idle_timeout < 0:
        raise CommandError("--idle-timeout must be 0 (never) or a number of seconds")
    try:
        module = importlib.import_module(PROTOCOLS[args.protocol])
    except ImportError as exc:
        extra = "bench" if args.protocol == "openenv" else "mcp"
        raise CommandError(f"--protocol {args.protocol} needs a package that is not installed "
                           f"(pip install 'envfactory[{extra}]'): {exc}") from None
    if args.protocol == "mcp" and args.transport == "stdio":
        # the HTTP servers say their URL once they listen; stdio has no URL, and stdout is the protocol
        print(f"envfactory: serving {args.name} over MCP on stdio: an MCP client that started this process "
              "talks to it through stdin and stdout (for a network server: --transport streamable-http --port N, "
              "or --protocol openenv)"
              + "; Ctrl-C stops it", file=sys.stderr, flush=True)
    return module.serve_run(args)


SERVE = Command("serve an environment to any client: '--protocol mcp' (stdio, or --transport streamable-http) "
                "or '--protocol openenv' (openenv-core's server: WebSocket EnvClient)", _serve_args, _serve_run,
                "envfactory serve Bank-v0                      # MCP over stdio (an MCP client spawns this)\n"
                "envfactory serve Bank-v0 --transport streamable-http --port 8000\n"
                "envfactory serve Bank-v0 --protocol openenv --port 0 --split eval\n"
                "ENVFACTORY_TOKEN=... envfactory serve Bank-v0 --protocol openenv --host 0.0.0.0")
