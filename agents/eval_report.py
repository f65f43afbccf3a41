"""The markdown report of an evaluation (:func:`agents.eval.evaluate`), with PNG plots.

Plots need matplotlib (the ``eval`` extra); without it the report is written
with its tables only and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_report"]


def _plots(doc: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = doc["environments"]
    names = [e["name"] for e in envs]
    rates = [e["success_rate"] for e in envs]
    err = [[r - e["ci95"][0] for r, e in zip(rates, envs)], [e["ci95"][1] - r for r, e in zip(rates, envs)]]
    fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(names) + 2), 3.2))
    ax.bar(names, rates, yerr=err, capsize=4, color="#4c72b0")
    ax.set_ylim(0, 1)
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_title(f"{doc['policy']}: {doc['episodes_per_env']} episodes per environment")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(out / "success.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key, title in zip(axes, ("turns", "tool_calls", "parse_errors"),
                              ("turns per episode", "tool calls per episode", "parse errors per episode")):
        data = [[r[key] for r in doc["episodes"] if r["env"] == n] for n in names]
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=20, ha="right")
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out / "episodes.png", dpi=110)
    plt.close(fig)
    return ["success.png", "episodes.png"]


def write_report(doc: dict[str, Any], directory: str | Path) -> Path:
    """Write ``report.md``, ``results.json`` and the plots into ``directory``; return the report's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    try:
        images = _plots(doc, out)
        note = ""
    except ImportError:
        images = []
        note = "\n_Plots skipped: matplotlib is not installed (pip install 'envfactory[eval]')._\n"
    t = doc["totals"]
    lines = [
        f"# Evaluation of `{doc['policy']}`",
        "",
        f"{t['episodes']} episodes ({doc['episodes_per_env']} per environment), runtime `{doc['runtime']}`, "
        f"temperature {doc['temperature']}, {doc['seconds']} s. Overall success "
        f"**{t['success_rate']:.1%}** (95% Wilson CI {t['ci95'][0]:.1%}–{t['ci95'][1]:.1%}).",
        "",
        "| environment | episodes | success | 95% CI | turns | tool calls | tool errors | parse errors | failed |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for e in doc["environments"] + [{"name": "**all**", **t}]:
        lines.append(
            f"| {e['name']} | {e['episodes']} | {e['success_rate']:.1%} | {e['ci95'][0]:.1%}–{e['ci95'][1]:.1%} "
            f"| {e['mean_turns']} | {e['mean_tool_calls']} | {e['mean_tool_errors']} | {e['mean_parse_errors']} "
            f"| {e['failed_episodes']} |"
        )
    lines.append("")
    lines += [f"![{name}]({name})" for name in images]
    if note:
        lines.append(note)
    failed = [r for r in doc["episodes"] if r["error"]]
    if failed:
        lines += ["", "## Failed episodes", ""] + [f"- {r['env']} {r['task']}: {r['error']}" for r in failed[:50]]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
