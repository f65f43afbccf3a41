"""Trajectory datasets: episodes as JSONL or Parquet files that ``datasets.load_dataset`` reads.

The one trajectory format and its one writer and reader. One row per role trajectory
(:class:`~agents.rollout.Trajectory`, a pydantic model), with the columns

* ``env_name``, ``env_version`` (:func:`agents.rollout.env_version`), ``task_id``, ``agent``, ``seed``;
* ``prompt_ids``, ``response_ids``, ``loss_mask``, ``logprobs``, ``entropies``, ``turn_spans``:
  the token-in/token-out sample (``loss_mask`` 1 on sampled tokens, 0 on inserted tool output);
* ``reward``, ``success``, ``terminated``, ``truncated``, ``error``, ``turns``, ``tool_calls``,
  ``tool_errors``, ``parse_errors``, ``token_exact``;
* ``messages`` and ``tools``: the conversation and the tool schemas rendered into the prompt, as
  JSON text (``json.loads(row["messages"])``): their shapes vary from tool to tool, which a
  columnar schema cannot hold as nested columns.

``load_dataset("json", data_files=".../trajectories.jsonl")`` or ``load_dataset("parquet", ...)``
reads them; :func:`load_trajectories` reads them back into trajectories, and
``Trainer.sft(trajectories=...)`` trains on them. :func:`to_sft_dataset` makes them a
conversational ``datasets.Dataset`` that TRL's ``SFTTrainer`` trains on as it is (``messages``
and ``tools`` as real lists, not JSON text). ``envfactory eval --save-trajectories DIR``
(or ``--trajectories FILE``) and a Trainer with ``output.save_trajectories`` write them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from agents.rollout import Trajectory

__all__ = ["save_trajectories", "load_trajectories", "trajectory_row", "row_trajectory", "to_sft_dataset",
           "FORMATS"]

FORMATS = ("jsonl", "parquet")
_JSON_COLUMNS = ("messages", "tools")


def trajectory_row(t: Trajectory) -> dict[str, Any]:
    """``t`` as one dataset row (see the module docstring)."""
    row = t.to_json()
    for c in _JSON_COLUMNS:
        row[c] = json.dumps(row[c], ensure_ascii=False, default=str)
    return row


def row_trajectory(row: dict[str, Any]) -> Trajectory:
    """A dataset row (as written by :func:`trajectory_row`) as a trajectory."""
    d = dict(row)
    for c in _JSON_COLUMNS:
        if isinstance(d.get(c), str):
            d[c] = json.loads(d[c])
    return Trajectory.from_json(d)  # columns it does not know (a newer writer's) are ignored


def save_trajectories(trajectories: Iterable[Trajectory], path: str | os.PathLike[str], *,
                      format: str | None = None, append: bool = False) -> Path:
    """Write ``trajectories``; return the file written.

    Args:
        path: A file (``.jsonl`` or ``.parquet``) or a folder (then ``trajectories.<format>`` in it).
        format: ``"jsonl"`` (default) or ``"parquet"`` (needs ``pyarrow``); default: from the file name.
        append: Add to an existing JSONL file instead of replacing it.

    Raises:
        ValueError: an unknown format, or appending to Parquet.
    """
    p = Path(path)
    if format is None:
        format = p.suffix.lstrip(".") if p.suffix in (".jsonl", ".parquet") else "jsonl"
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
    if p.suffix not in (".jsonl", ".parquet"):
        p = p / f"trajectories.{format}"
    p.parent.mkdir(parents=True, exist_ok=True)
    rows = [trajectory_row(t) for t in trajectories]
    if format == "jsonl":
        with open(p, "a" if append else "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        return p
    if append:
        raise ValueError("Parquet files are written whole; append to JSONL, or write one file per batch")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), p)
    return p


def load_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Trajectories from a JSONL or Parquet file written by :func:`save_trajectories` (or a folder
    holding ``trajectories.jsonl`` / ``.parquet``); rows whose ``messages`` and ``tools`` are JSON
    values rather than JSON text (files of older versions) read the same.

    Raises:
        FileNotFoundError: no such file. ValueError: a row that is not a trajectory (names the line).
    """
    p = Path(path)
    if p.is_dir():
        found = [p / f"trajectories.{f}" for f in FORMATS if (p / f"trajectories.{f}").exists()]
        if not found:
            raise FileNotFoundError(f"{p}: no trajectories.jsonl or trajectories.parquet in it")
        p = found[0]
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [row_trajectory(r) for r in pq.read_table(p).to_pylist()]
    out = []
    with open(p, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(row_trajectory(json.loads(line)))
            except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
                raise ValueError(f"{p}:{i}: not a trajectory row ({type(exc).__name__}: {exc})") from None
    return out


SFT_COLUMNS = ("messages", "tools", "env_name", "task_id", "agent", "reward", "success")


def to_sft_dataset(trajectories: Iterable[Trajectory] | str | os.PathLike[str], *,
                   successful_only: bool = True) -> Any:
    """Trajectories as a conversational ``datasets.Dataset`` that TRL's ``SFTTrainer`` trains on
    unchanged (no ``json.loads`` mapping first).

    Each row has ``messages``: the role's conversation as a list of message dicts (``role``,
    ``content``, and a tool response's ``name`` and ``tool_call_id``), exactly as recorded, so the
    chat template renders the text the model saw and wrote: an assistant turn's tool calls are in
    its ``content`` as the model wrote them (``<tool_call>...</tool_call>``, the form the
    project's template and Hermes-style templates expect); ``tools``: the tool schemas rendered
    into the prompt, a list of OpenAI-style function schemas (the ``tools`` that ``SFTTrainer``
    hands to ``apply_chat_template``); and ``env_name``, ``task_id``, ``agent``, ``reward``,
    ``success``. ``messages`` and ``tools`` are ``datasets.Json`` columns: every message and
    schema keeps its own keys (no columnar padding with ``None``), and a map over the dataset sees
    plain lists and dicts.

    Args:
        trajectories: ``Trajectory`` objects, or a file or folder written by :func:`save_trajectories`.
        successful_only: Keep only the trajectories that succeeded (the default: rejection
            sampling, as ``Trainer.sft(trajectories=...)`` does); ``False`` keeps failures too.
            Trajectories that ended in an error, or in which the role never took a turn, are
            always left out.

    Raises:
        ValueError: no trajectory is left to train on.
    """
    from datasets import Dataset, Features, Json, List, Value

    trajs = load_trajectories(trajectories) if isinstance(trajectories, (str, os.PathLike)) else list(trajectories)
    keep = [t for t in trajs if t.error is None and t.turns > 0
            and any(m.get("role") == "assistant" for m in t.messages) and (t.success or not successful_only)]
    if not keep:
        raise ValueError(f"none of {len(trajs)} trajectories is fit for SFT (an error, no assistant turn"
                         + (", or not successful: successful_only=True" if successful_only else "") + ")")
    features = Features({"messages": List(Json()), "tools": List(Json()), "env_name": Value("string"),
                         "task_id": Value("string"), "agent": Value("string"), "reward": Value("float64"),
                         "success": Value("bool")})
    rows = [{"messages": [dict(m) for m in t.messages], "tools": list(t.tools), "env_name": t.env_name,
             "task_id": t.task_id, "agent": t.agent, "reward": float(t.reward), "success": bool(t.success)}
            for t in keep]
    return Dataset.from_list(rows, features=features)
