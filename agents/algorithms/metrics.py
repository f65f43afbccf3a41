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
