"""The examples of each face that no other test runs: an MCP client playing `envfactory serve
--protocol mcp`, and trajectories written and read as a Hugging Face dataset. (examples/mcp/kb_env.py,
examples/openenv and examples/trl run in test_mcp_import, test_openenv_serve and test_trl), and an unchanged
openai-SDK agent loop trained through the endpoint (examples/train/openai_agent_loop.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import require_module

ROOT = Path(__file__).resolve().parents[1]


def _load(rel: str):
    spec = importlib.util.spec_from_file_location(Path(rel).stem + "_example", ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_mcp_client_plays_reference_solutions_for_full_reward() -> None:
    require_module("mcp", "pip install 'envfactory[mcp]' (scripts/setup.sh installs it)")
    rows = _load("examples/mcp/play_mcp.py").main(["Bank-v0", "--episodes", "2"])
    assert [r["task"] for r in rows] == ["bank-000", "bank-001"]
    assert all(r["reward"] == 1.0 and r["done"] for r in rows)


def test_trajectories_round_trip_through_a_dataset(tmp_path) -> None:
    require_module("datasets", "pip install 'envfactory[dev]' (scripts/setup.sh installs it)")
    doc = _load("examples/datasets/trajectories.py").main(["Bank-v0", "--out", str(tmp_path), "--episodes", "3"])
    assert doc["rows"] == 3 and doc["round_trip"] and doc["rewards"] == [1.0, 1.0, 1.0]
    assert {"messages", "tools", "reward", "task_id", "env_version", "seed"} <= set(doc["columns"])


def test_an_unchanged_openai_loop_trains_through_the_endpoint() -> None:
    require_module("openai", "pip install openai")
    rows = _load("examples/train/openai_agent_loop.py").main(["--steps", "1"])
    assert [r["step"] for r in rows] == [1] and rows[0]["episodes"] == 4 and rows[0]["errors"] == 0
    assert rows[0]["calls"] >= 4  # every run made at least one call through the endpoint
