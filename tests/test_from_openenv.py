"""``envfactory.factory.from_openenv``: an OpenEnv ``MCPEnvironment`` class, unchanged, as an envfactory
environment (issue 62).

A small OpenEnv environment written here (a shop: ``add_item`` and ``view_cart``, stateful, on its
FastMCP server; ``add_item`` raises when the stock runs out; ``checkout`` ends the episode with the
environment's own reward, and its overridden ``step`` raises on an empty cart) is imported and played
through envfactory, in PyPI's current OpenEnv (``openenv`` 0.10, the venv of
``test_openenv_current``, built once) and in this interpreter's ``openenv-core`` 0.3 (the ``bench``
extra): its reference solution earns 1 in the from_mcp world and the local one; a tool's own failure,
a ``step`` that raises, a malformed call and a call after ``done`` are error observations; a wrong
solution earns 0; fork and snapshot are refused without ``restore`` and replay the journal with
``restore="replay"``. The same class served by OpenEnv's own server (``create_app``, uvicorn in a
thread) and imported by its URL plays the same, one session per episode. Without openenv, the module
imports and ``from_openenv`` names the package.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import import_without, require_module
from test_openenv_current import openenv_python  # noqa: F401 - the same venv (a fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_the_module_imports_without_openenv_and_names_the_package() -> None:
    out = import_without("openenv", "envfactory.factory.from_openenv",
                         "m.from_openenv(object, name='X-v0', tasks=[])")
    assert "ImportError: from_openenv needs OpenEnv (pip install 'openenv>=0.10'" in out, out
    out = import_without("openenv", "envfactory.factory", "m.from_openenv(object, name='X-v0', tasks=[])")
    assert "ImportError: from_openenv needs OpenEnv" in out, out


SHOP = r'''
import json
from typing import Any, Optional

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State

import envfactory
from envfactory.episode import Episode
from envfactory.factory import from_openenv, openenv_task
from envfactory.factory.from_mcp import make_episode
from envfactory.task import ToolCall


class ShopEnv(MCPEnvironment):
    """A shop: put items in the cart, then check out; the reward is whether the cart is the order."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, stock: Optional[dict] = None) -> None:
        mcp = FastMCP("shop")
        self.initial = dict(stock or {"apple": 3, "pear": 1})
        self.stock, self.cart, self.order = dict(self.initial), [], []

        @mcp.tool
        def add_item(item: str, count: int = 1) -> str:
            """Put items in the cart."""
            if self.stock.get(item, 0) < count:
                raise ValueError(f"only {self.stock.get(item, 0)} {item} left")
            self.stock[item] -= count
            self.cart += [item] * count
            return "cart: " + ", ".join(self.cart)

        @mcp.tool
        def view_cart() -> str:
            """The items in the cart."""
            return ", ".join(self.cart) or "(empty)"

        @mcp.tool
        def checkout() -> str:
            """Pay for the cart and leave."""
            return "paid for " + ", ".join(self.cart)

        super().__init__(mcp)
        self._state = State(episode_id="shop", step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, order: Any = (),
              **kwargs: Any) -> Observation:
        self.stock, self.cart, self.order = dict(self.initial), [], list(order)
        return Observation(done=False, reward=0.0, metadata={"order": self.order})

    def _paying(self, action: Action) -> bool:
        paying = isinstance(action, CallToolAction) and action.tool_name == "checkout"
        if paying and not self.cart:
            raise RuntimeError("nothing to pay for")
        return paying

    def _paid(self, obs: Observation) -> Observation:
        obs.done, obs.reward = True, float(sorted(self.cart) == sorted(self.order))
        return obs

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        paying = self._paying(action)
        obs = super().step(action, timeout_s=timeout_s, **kwargs)
        return self._paid(obs) if paying else obs

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        paying = self._paying(action)  # (OpenEnv's server steps through step_async)
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        return self._paid(obs) if paying else obs

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": "MCP actions only"})

    @property
    def state(self) -> State:
        return self._state


SOLUTION = [ToolCall("add_item", {"item": "apple", "count": 2}), ToolCall("add_item", {"item": "pear"}),
            ToolCall("checkout", {})]
TASKS = [openenv_task("shop-1", "Buy two apples and a pear, then check out.", SOLUTION,
                      reset={"order": ["apple", "apple", "pear"]}),
         openenv_task("shop-2", "The pear is in the cart already: add an apple, then check out.",
                      [ToolCall("add_item", {"item": "apple"}), ToolCall("checkout", {})],
                      reset={"order": ["pear", "apple"]}, setup=[ToolCall("add_item", {"item": "pear"})])]
out = {}
spec = from_openenv(ShopEnv, name="Shop-v0", tasks=TASKS, init={"stock": {"apple": 3, "pear": 1}})
out["tools"] = [t["function"]["name"] for t in spec.tool_schemas()]
out["schema"] = next(t for t in spec.tool_schemas() if t["function"]["name"] == "add_item")["function"]["parameters"]


def say(ep, action):
    r = ep.step(action)
    return [m["content"] for m in r.messages], r.reward, r.done


def reference(ep, task_id):
    ep.reset(task_id)
    seen = [say(ep, [c])[0][0] for c in spec.task(task_id).solution]
    return seen, say(ep, [ToolCall("finish", {"answer": "done"})])[1:], ep.state.reward


for label, ep in (("mcp", make_episode(spec)), ("local", Episode(spec))):
    out[label] = {t: reference(ep, t) for t in ("shop-1", "shop-2")}
    ep.close()

ep = make_episode(spec)
ep.reset("shop-1")
out["errors"] = [say(ep, '<tool_call>{"name": "add_item", "arguments": {"item": "pear", "count": 5}}</tool_call>')[0][0],
                 say(ep, [ToolCall("checkout", {})])[0][0],
                 say(ep, [ToolCall("add_item", {"item": 3})])[0][0],
                 say(ep, [ToolCall("add_item", {"item": "pear", "bogus": 1})])[0][0],
                 say(ep, [ToolCall("no_such_tool", {})])[0][0]]
out["ok_after"] = say(ep, [ToolCall("view_cart", {})])[0][0]
out["log_ok"] = [e["ok"] for e in ep.status.log]
# a wrong solution: the environment's own reward 0
say(ep, [ToolCall("add_item", {"item": "apple"})])
out["wrong_checkout"] = say(ep, [ToolCall("checkout", {})])
out["after_done"] = say(ep, [ToolCall("view_cart", {})])[0][0]
out["wrong"] = say(ep, "Done.")[1:]
ep.reset("shop-1")
out["noop"] = say(ep, "Done.")[1:]
out["state"] = ep.state.model_dump(mode="json")
# fork and snapshot: refused without restore
ep.reset("shop-1")
say(ep, [ToolCall("add_item", {"item": "apple"})])
refused = []
for what in (ep.fork, ep.snapshot):
    try:
        what()
        refused.append("allowed")
    except NotImplementedError as exc:
        refused.append(str(exc))
out["refused"] = refused
ep.close()
# with restore="replay": a fork replays the journal on a fresh instance
replay = from_openenv(ShopEnv, name="ShopReplay-v0", tasks=TASKS, restore="replay")
ep = make_episode(replay)
ep.reset("shop-1")
say(ep, [ToolCall("add_item", {"item": "apple", "count": 2})])
child = ep.fork()
snap = json.loads(json.dumps(ep.snapshot()))
say(child, [ToolCall("add_item", {"item": "apple"})])
out["fork"] = [say(child, [ToolCall("view_cart", {})])[0][0], say(ep, [ToolCall("view_cart", {})])[0][0]]
other = make_episode(replay)
other.restore(snap)
out["restored"] = say(other, [ToolCall("view_cart", {})])[0][0]
for e in (ep, other):
    say(e, [ToolCall("add_item", {"item": "pear"})])
    say(e, [ToolCall("checkout", {})])
out["replayed"] = [say(e, [ToolCall("finish", {"answer": "done"})])[1] for e in (ep, other)]
for e in (ep, child, other):
    e.close()

# a running OpenEnv server of the same class: one session per episode
import socket, threading, time
import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolObservation

app = create_app(ShopEnv, CallToolAction, CallToolObservation, env_name="shop", max_concurrent_envs=8)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
sock.close()
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
threading.Thread(target=server.run, daemon=True).start()
deadline = time.monotonic() + 60
while not server.started and time.monotonic() < deadline:
    time.sleep(0.05)
served = from_openenv(f"http://127.0.0.1:{port}", name="ShopServed-v0", tasks=TASKS, restore="replay")
out["served_tools"] = [t["function"]["name"] for t in served.tool_schemas()]
ep = make_episode(served)
out["served"] = {t: reference(ep, t) for t in ("shop-1", "shop-2")}
ep.reset("shop-1")
out["served_errors"] = [say(ep, [ToolCall("add_item", {"item": "pear", "count": 5})])[0][0],
                        say(ep, [ToolCall("checkout", {})])[0][0],
                        say(ep, [ToolCall("add_item", {"item": "pear", "bogus": 1})])[0][0]]
say(ep, [ToolCall("add_item", {"item": "apple"})])
child = ep.fork()
say(child, [ToolCall("add_item", {"item": "apple"})])
out["served_fork"] = [say(child, [ToolCall("view_cart", {})])[0][0], say(ep, [ToolCall("view_cart", {})])[0][0]]
say(ep, [ToolCall("checkout", {})])
out["served_wrong"] = say(ep, "Done.")[1:]
ep.close()
child.close()
server.should_exit = True
print(json.dumps(out))
'''


def _run_shop(python: str, tmp_path: Path) -> dict:
    script = tmp_path / "shop.py"
    script.write_text(SHOP)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    r = subprocess.run([python, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("where", ["openenv-0.10", "openenv-core-here"])
def test_an_openenv_environment_plays_through_envfactory(where: str, request: pytest.FixtureRequest,
                                                         tmp_path: Path) -> None:
    if where == "openenv-core-here":
        require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")
        python = sys.executable
    else:
        python = request.getfixturevalue("openenv_python")
    out = _run_shop(python, tmp_path)
    assert out["tools"] == ["add_item", "view_cart", "checkout", "finish"]
    schema = out["schema"]
    assert schema["required"] == ["item"] and set(schema["properties"]) == {"item", "count"}
    assert schema["additionalProperties"] is False
    for label in ("mcp", "local"):
        seen, (reward, done), env_reward = out[label]["shop-1"]
        assert seen == ["cart: apple, apple", "cart: apple, apple, pear", "paid for apple, apple, pear"], seen
        assert reward == 1.0 and done and env_reward == 1.0
        seen, (reward, done), env_reward = out[label]["shop-2"]  # its setup ran after reset
        assert seen == ["cart: pear, apple", "paid for pear, apple"] and reward == 1.0 and done, out[label]
    stock, empty, bad_type, unknown_arg, unknown_tool = out["errors"]
    assert stock.startswith("Error: ") and "only 1 pear left" in stock, stock  # the tool's own exception
    assert empty == "Error: RuntimeError: nothing to pay for", empty  # raised by the environment's step
    assert bad_type.startswith("Error: invalid arguments for tool 'add_item'") and "not of type 'string'" in bad_type
    assert unknown_arg.startswith("Error: invalid arguments for tool 'add_item'") and "bogus" in unknown_arg
    assert unknown_tool.startswith("Error:") and "no_such_tool" in unknown_tool
    assert out["ok_after"] == "(empty)" and out["log_ok"] == [False] * 5 + [True]
    assert out["wrong_checkout"] == [["paid for apple"], 0.0, False]  # the episode goes on until finish
    assert out["after_done"].startswith("Error: the episode is over: the environment reported done (reward 0.0)")
    assert out["wrong"] == [0.0, True] and out["noop"] == [0.0, True]
    assert out["state"]["reset_kwargs"] == {"order": ["apple", "apple", "pear"]} and out["state"]["reward"] is None
    assert all("restore='replay'" in r for r in out["refused"]), out["refused"]
    assert out["fork"] == ["apple, apple, apple", "apple, apple"] and out["restored"] == "apple, apple"
    assert out["replayed"] == [1.0, 1.0]
    # the same class on a running OpenEnv server: one session per episode
    assert out["served_tools"] == out["tools"]
    for task in ("shop-1", "shop-2"):
        assert out["served"][task] == out["mcp"][task], out["served"]
    stock, empty, unknown_arg = out["served_errors"]
    assert stock.startswith("Error: ") and "only 1 pear left" in stock, stock
    assert empty.startswith("Error: ") and "nothing to pay for" in empty, empty
    assert unknown_arg.startswith("Error: invalid arguments for tool 'add_item'"), unknown_arg
    assert out["served_fork"] == ["apple, apple", "apple"] and out["served_wrong"] == [0.0, True]


def test_a_servers_label_never_shows_its_password() -> None:
    from envfactory.factory.from_openenv import _shown_url

    assert _shown_url("http://envfactory:s3cret@127.0.0.1:8000/x") == "http://127.0.0.1:8000/x"
    assert _shown_url("https://[::1]:9/") == "https://[::1]:9/"


def test_refusals_are_named() -> None:
    require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")
    from envfactory.factory import from_openenv

    with pytest.raises(TypeError, match="or a server's base URL"):
        from_openenv("shop", name="X-v0", tasks=[])
    with pytest.raises(TypeError, match="headers are for a server's URL"):
        from_openenv(dict, name="X-v0", tasks=[], headers={"Authorization": "Bearer t"})
    with pytest.raises(TypeError, match="Environment class"):
        from_openenv(dict, name="X-v0", tasks=[])
    with pytest.raises(ValueError, match="restore must be None or 'replay'"):
        from_openenv(dict, name="X-v0", tasks=[], restore="files")  # type: ignore[arg-type]
