"""Training metrics: where a run's rows go (sinks), a PNG learning curve, a progress bar.

A row is one JSON-able dict per SFT epoch or RL step (``phase``, ``step`` or ``epoch``, figures).
The :class:`MetricsLog` keeps them in memory and hands each to every sink: anything with
``write(row)`` and ``close()`` (:class:`MetricsSink`). Built in, by the names ``output.sinks``
takes: ``jsonl`` (``output.dir/metrics.jsonl``), ``tensorboard`` (event files under
``output.dir/tensorboard``; the ``tensorboard`` extra) and ``wandb`` (Weights & Biases; the
``wandb`` extra). A plain callable is a sink too (:class:`CallableSink`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

__all__ = ["MetricsLog", "MetricsSink", "JsonlSink", "TensorBoardSink", "WandbSink", "CallableSink", "SINK_NAMES",
           "make_sinks", "scalars", "plot_learning_curve", "progress"]

SINK_NAMES = ("jsonl", "tensorboard", "wandb")
"""The sinks ``output.sinks`` names (objects and callables go to ``Trainer(sinks=[...])``)."""


@runtime_checkable
class MetricsSink(Protocol):
    """Where metric rows go: ``write`` gets every row as the trainer makes it; ``close`` once at the end."""

    def write(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsLog:
    """A run's rows, kept in memory (``rows``) and written to every sink."""

    def __init__(self, sinks: Iterable[MetricsSink] = ()) -> None:
        self.rows: list[dict[str, Any]] = []
        self.sinks = list(sinks)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        for sink in self.sinks:
            sink.write(row)

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after ``step`` where a sink can (a resumed run rewrites them)."""
        for sink in self.sinks:
            if isinstance(sink, JsonlSink):
                sink.truncate_after(step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class JsonlSink:
    """Appends each row to ``path`` as one JSON object per line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop training rows of steps after ``step``."""
        if not self.path.exists():
            return
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        keep = [r for r in rows if r.get("phase") != "train" or r.get("step", 0) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def close(self) -> None:
        pass


def scalars(row: Mapping[str, Any]) -> tuple[str, int | None, dict[str, float]]:
    """A row as ``(prefix, step, {name: value})`` for a tracker.

    ``prefix`` is ``phase``, then ``learner`` when the row names one (``sft/reader_0``); ``step``
    the row's ``step`` (else its ``epoch``; ``None`` without either). The values are the row's
    numbers (a bool as 0 or 1) other than that step; a nested mapping's numbers are named by
    their path (``learners/agent/loss``); strings and ``None`` are left out."""
    prefix = "/".join(str(row[k]) for k in ("phase", "learner") if row.get(k) not in (None, ""))
    axis = "step" if "step" in row else "epoch" if "epoch" in row else None
    step = int(row[axis]) if axis is not None else None
    out: dict[str, float] = {}

    def walk(d: Mapping[str, Any], path: str) -> None:
        for k, v in d.items():
            if isinstance(v, Mapping):
                walk(v, f"{path}{k}/")
            elif isinstance(v, (int, float)):
                out[f"{path}{k}"] = float(v)

    walk({k: v for k, v in row.items() if k not in (axis, "phase", "learner")}, "")
    return prefix or "metrics", step, out


def _extra_missing(what: str, extra: str, exc: ImportError) -> ImportError:
    return ImportError(f"the {what} sink needs the {extra} package: pip install 'envfactory[{extra}]' "
                       f"(or leave {what} out of output.sinks); {exc}")


class TensorBoardSink:
    """Each row's numbers as TensorBoard scalars (``torch.utils.tensorboard.SummaryWriter``) in
    ``log_dir``, tagged ``<phase>[/<learner>]/<name>`` at the row's step (:func:`scalars`);
    flushed after every row, so the event file is whole while training runs."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        try:
            import tensorboard  # noqa: F401  (torch's writer needs it, and says so less plainly)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _extra_missing("tensorboard", "tensorboard", exc) from exc
        self.log_dir = str(log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir)
        self._written = 0

    def write(self, row: dict[str, Any]) -> None:
        prefix, step, values = scalars(row)
        step = self._written if step is None else step
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, global_step=step)
        self.writer.flush()
        self._written += 1

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Each row's numbers to a Weights & Biases run (``wandb.init(**init)`` when the sink is made;
    ``wandb.finish()`` at ``close``). Keys are ``<phase>[/<learner>]/<name>``
    (:func:`scalars`); each phase is plotted against its own step (``train/step``,
    ``sft/<learner>/epoch``) through ``wandb.define_metric``, since W&B's own step must only
    grow and an SFT warm start's epochs come before RL step 1."""

    def __init__(self, **init: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise _extra_missing("wandb", "wandb", exc) from exc
        self.wandb = wandb
        self.run = wandb.init(**init)
        self._axes: set[str] = set()

    def write(self, row: dict[str, Any]) -> None:
        prefix, step, values = scalars(row)
        logged = {f"{prefix}/{k}": v for k, v in values.items()}
        if step is not None:
            axis = f"{prefix}/{'step' if 'step' in row else 'epoch'}"
            if axis not in self._axes:
                self.wandb.define_metric(axis)
                self.wandb.define_metric(f"{prefix}/*", step_metric=axis)
                self._axes.add(axis)
            logged[axis] = step
        self.wandb.log(logged)

    def close(self) -> None:
        self.wandb.finish()


class CallableSink:
    """A function as a sink: ``fn(row)`` for every row."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.fn = fn

    def write(self, row: dict[str, Any]) -> None:
        self.fn(row)

    def close(self) -> None:
        pass


def make_sinks(names: Sequence[str], output_dir: str | os.PathLike[str] | None, *,
               objects: Sequence[Any] = (), config: dict[str, Any] | None = None) -> list[MetricsSink]:
    """The sinks ``names`` (``output.sinks``) make for a run writing to ``output_dir``, then
    ``objects``: sinks as they are, callables wrapped (:class:`CallableSink`).

    ``jsonl`` writes ``output_dir/metrics.jsonl`` (nothing without an ``output_dir``: the rows
    stay in memory); ``tensorboard`` writes under ``output_dir/tensorboard``; ``wandb`` starts a
    run with ``config`` (the trainer's) in ``output_dir``.

    Raises:
        ValueError: an unknown name, ``tensorboard`` without an ``output_dir``, or an object that is
            neither a sink nor callable.
        ImportError: the package of a named sink is not installed (naming the extra to install).
    """
    sinks: list[MetricsSink] = []
    try:
        _add_sinks(sinks, names, Path(output_dir) if output_dir else None, objects, config)
    except Exception:  # close what was opened before the one that failed
        for sink in sinks:
            sink.close()
        raise
    return sinks


def _add_sinks(sinks: list[MetricsSink], names: Sequence[str], out_dir: Path | None, objects: Sequence[Any],
               config: dict[str, Any] | None) -> None:
    for name in names:
        if name == "jsonl":
            if out_dir is not None:
                sinks.append(JsonlSink(out_dir / "metrics.jsonl"))
        elif name == "tensorboard":
            if out_dir is None:
                raise ValueError("the tensorboard sink writes under output.dir: set output.dir")
            sinks.append(TensorBoardSink(out_dir / "tensorboard"))
        elif name == "wandb":
            init: dict[str, Any] = {"config": config}
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
                init["dir"] = str(out_dir)
            sinks.append(WandbSink(**init))
        else:
            raise ValueError(unknown_sink(name))
    for obj in objects:
        if isinstance(obj, MetricsSink):
            sinks.append(obj)
        elif callable(obj):
            sinks.append(CallableSink(obj))
        else:
            raise ValueError(f"a sink must have write(row) and close(), or be a callable taking a row; "
                             f"got {type(obj).__name__}")


def unknown_sink(name: Any) -> str:
    return (f"unknown sink {name!r} in output.sinks; the sinks are {list(SINK_NAMES)} (pass other sinks, "
            "objects with write(row) and close() or callables, as Trainer(sinks=[...]))")


def plot_learning_curve(series: dict[str, Sequence[tuple[float, float]]], path: str | os.PathLike[str], *,
                        title: str = "learning curve", xlabel: str = "step", ylabel: str = "success rate") -> str:
    """Draw ``{label: [(x, y), ...]}`` as lines into a PNG; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, pts in series.items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)


_BARS: dict[str, Any] = {}  # label -> its live tqdm bar (one per loop being reported)


def progress(label: str, i: int, n: int, started: float, **fields: Any) -> None:
    """Step ``i`` of ``n`` of the loop ``label`` (begun at ``time.perf_counter()`` ``started``) on a
    tqdm bar on stderr, with ``fields`` after it; shown when stderr is a terminal, closed at ``i >= n``."""
    from tqdm import tqdm

    bar = _BARS.get(label)
    if bar is None or bar.total != n or i < bar.n:  # a new loop under this label
        if bar is not None:
            bar.close()
        bar = _BARS[label] = tqdm(total=n, desc=label, file=sys.stderr, disable=None, dynamic_ncols=True)
        if not bar.disable:  # elapsed time counts from the loop's start, not from this first report
            bar.start_t -= time.perf_counter() - started
    bar.set_postfix({k: f"{v:.3g}" if isinstance(v, float) else v for k, v in fields.items()}, refresh=False)
    bar.update(i - bar.n)
    if i >= n:
        bar.close()
        del _BARS[label]
