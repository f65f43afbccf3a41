"""Training metrics: one JSON object per line, a PNG learning curve, a progress line."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = ["MetricsLog", "plot_learning_curve", "progress"]


class MetricsLog:
    """Appends rows to ``path`` (JSONL); keeps them in memory too."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self.rows: list[dict[str, Any]] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after ``step`` (a resumed run rewrites them)."""
        if self.path is None or not self.path.exists():
            return
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        keep = [r for r in rows if r.get("phase") != "train" or r.get("step", 0) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))


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


def progress(label: str, i: int, n: int, started: float, **fields: Any) -> None:
    """One overwritten stderr line: ``label i/n [bar] key=value ... elapsed``."""
    width = 20
    done = int(width * i / max(n, 1))
    bits = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
    end = "\n" if i >= n else ""
    sys.stderr.write(f"\r{label} {i}/{n} [{'#' * done}{'.' * (width - done)}] {bits} "
                     f"{time.perf_counter() - started:.0f}s{end}")
    sys.stderr.flush()
