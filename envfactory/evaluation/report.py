"""Evaluation reports: markdown with charts, for one agent or a team.

:func:`write_report` writes, for a team evaluation (:func:`envfactory.evaluation.eval.evaluate`),
``team_eval.json``, ``team_eval.md`` and ``plots/*.svg`` (no plotting dependency): a
success chart with 95% intervals per environment and policy, a cross-play heatmap and
a contribution chart per environment, and for competitive games the policies' ratings
with their 95% intervals (pooled and per game) and head-to-head tables. For a single-agent evaluation
(:func:`agents.eval.evaluate`) it writes ``results.json``, ``report.md`` and PNG plots
(success with 95% intervals per environment; turns, tool calls and parse errors per
episode). Those need matplotlib (the ``eval`` extra); without it the report has its
tables only and says so.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["write_report", "markdown", "agent_markdown", "success_chart", "heatmap", "contribution_chart",
           "rating_chart"]

_COLORS = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477"]


def _svg(width: int, height: int, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def success_chart(doc: dict[str, Any], mode: str) -> str:
    """Grouped bars: joint success per environment and policy, with 95% Wilson whiskers."""
    envs, pols = doc["environments"], doc["policies"]
    bw, gap, h, top, left = 14, 18, 200, 30, 40
    width = left + len(envs) * (len(pols) * bw + gap) + 160
    body = [f'<text x="{left}" y="18" font-size="13">Joint success ({mode}), 95% CI</text>',
            f'<line x1="{left}" y1="{top + h}" x2="{width - 150}" y2="{top + h}" stroke="black"/>']
    for frac in (0, 0.5, 1):
        y = top + h - frac * h
        body.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{frac:g}</text>')
        body.append(f'<line x1="{left}" y1="{y}" x2="{width - 150}" y2="{y}" stroke="#ddd"/>')
    for i, e in enumerate(envs):
        x0 = left + gap / 2 + i * (len(pols) * bw + gap)
        for j, p in enumerate(pols):
            m = e["teams"][p].get(mode)
            if not m or m["success_rate"] is None:
                continue
            x, s = x0 + j * bw, m["success_rate"]
            lo, hi = m["ci95"]
            body.append(f'<rect x="{x}" y="{top + h - s * h}" width="{bw - 2}" height="{s * h}" '
                        f'fill="{_COLORS[j % len(_COLORS)]}"/>')
            cx = x + (bw - 2) / 2
            body.append(f'<line x1="{cx}" y1="{top + h - lo * h}" x2="{cx}" y2="{top + h - hi * h}" stroke="black"/>')
        label = escape(e["name"].replace("-v0", ""))
        body.append(f'<text x="{x0}" y="{top + h + 14}" font-size="9">{label}</text>')
    for j, p in enumerate(pols):
        y = top + 10 + j * 16
        body.append(f'<rect x="{width - 140}" y="{y - 9}" width="10" height="10" fill="{_COLORS[j % len(_COLORS)]}"/>')
        body.append(f'<text x="{width - 125}" y="{y}">{escape(p)}</text>')
    return _svg(int(width), top + h + 30, body)


def heatmap(env: dict[str, Any]) -> str:
    """Cross-play matrix: row policy plays one role, column policy the others."""
    pols = list(env["cross_play"])
    cell, left, top = 46, 70, 40
    size = left + cell * len(pols) + 10
    body = [f'<text x="4" y="14" font-size="12">{escape(env["name"])} cross-play (success)</text>',
            f'<text x="{left}" y="30" font-size="9">others play (columns); one role plays (rows)</text>']
    for i, r in enumerate(pols):
        body.append(f'<text x="{left - 4}" y="{top + i * cell + cell / 2 + 4}" text-anchor="end">{escape(r)}</text>')
        for j, c in enumerate(pols):
            v = env["cross_play"][r][c]
            shade = 255 - int(200 * (v or 0))
            x, y = left + j * cell, top + i * cell
            body.append(f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" fill="rgb({shade},{shade},255)"/>')
            body.append(f'<text x="{x + cell / 2 - 1}" y="{y + cell / 2 + 4}" text-anchor="middle">'
                        f'{"-" if v is None else f"{v:.2f}"}</text>')
    for j, c in enumerate(pols):
        body.append(f'<text x="{left + j * cell + cell / 2}" y="{top + len(pols) * cell + 14}" '
                    f'text-anchor="middle">{escape(c)}</text>')
    return _svg(size, top + len(pols) * cell + 24, body)


def contribution_chart(env: dict[str, Any], policy: str) -> str:
    """Per agent: team success minus success with that agent replaced by a no-op."""
    contrib = env["contribution"][policy]
    bw, left, top, h = 60, 40, 30, 120
    width = left + bw * len(contrib) + 20
    body = [f'<text x="4" y="16" font-size="12">{escape(env["name"])}: contribution ({escape(policy)} team)</text>',
            f'<line x1="{left}" y1="{top + h}" x2="{width - 10}" y2="{top + h}" stroke="black"/>']
    for i, (agent, c) in enumerate(contrib.items()):
        v = max(0.0, c["contribution"] or 0.0)
        x = left + i * bw + 8
        body.append(f'<rect x="{x}" y="{top + h - v * h}" width="{bw - 16}" height="{v * h}" fill="#109618"/>')
        body.append(f'<text x="{x + (bw - 16) / 2}" y="{top + h - v * h - 3}" text-anchor="middle">{v:.2f}</text>')
        body.append(f'<text x="{x + (bw - 16) / 2}" y="{top + h + 14}" text-anchor="middle" font-size="9">'
                    f'{escape(agent)}</text>')
    return _svg(width, top + h + 24, body)


def rating_chart(ratings: dict[str, Any], title: str) -> str:
    """Each policy's rating (a dot) with its 95% interval (a whisker), on a shared Elo axis."""
    rows = list(ratings.items())
    left, top, row_h, width = 90, 34, 22, 520
    lo = min([r["ci95"][0] for _, r in rows] + [1500.0])
    hi = max([r["ci95"][1] for _, r in rows] + [1500.0])
    lo, hi = 100 * (lo // 100), 100 * (hi // 100 + 1)

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - 20)

    bottom = top + row_h * len(rows)
    body = [f'<text x="4" y="16" font-size="12">{escape(title)}</text>']
    for tick in range(int(lo), int(hi) + 1, 100 if hi - lo <= 1000 else 200):
        body.append(f'<line x1="{x(tick)}" y1="{top - 6}" x2="{x(tick)}" y2="{bottom}" stroke="#eee"/>')
        body.append(f'<text x="{x(tick)}" y="{bottom + 14}" text-anchor="middle" font-size="9">{tick}</text>')
    for i, (name, r) in enumerate(rows):
        y = top + i * row_h + row_h / 2
        body.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{escape(name)}</text>')
        body.append(f'<line x1="{x(r["ci95"][0])}" y1="{y}" x2="{x(r["ci95"][1])}" y2="{y}" stroke="black"/>')
        body.append(f'<circle cx="{x(r["rating"])}" cy="{y}" r="4" fill="{_COLORS[i % len(_COLORS)]}"/>')
        body.append(f'<text x="{x(r["rating"])}" y="{y - 6}" text-anchor="middle" font-size="9">{r["rating"]:.0f}</text>')
    return _svg(width, bottom + 22, body)


def _rating_table(ratings: dict[str, Any]) -> list[str]:
    lines = ["| policy | rating | ± sd | 95% CI | mean score | wins / draws / losses |", "|---|---|---|---|---|---|"]
    for p, r in ratings.items():
        lines.append(f"| {p} | {r['rating']:.0f} | {r['sd']:.0f} | [{r['ci95'][0]:.0f}, {r['ci95'][1]:.0f}] | "
                     f"{_fmt(r['score'])} | {r['wins']} / {r['draws']} / {r['losses']} |")
    return lines


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def markdown(doc: dict[str, Any], plots: dict[str, str]) -> str:
    """The team report's markdown text; ``plots`` maps a plot key to its relative path."""
    lines = ["# Coordination evaluation", "",
             f"Policies: {', '.join(doc['policies'])}. Modes: {', '.join(doc['modes'])}. Stochastic policies play "
             f"{doc['episodes_per_task']} episodes per task; model policies at most {doc['model_tasks_per_env']} "
             f"tasks per environment. Took {doc['seconds']}s.", "",
             "## Summary (pooled over environments)", "",
             "| policy | mode | success | 95% CI | episodes |", "|---|---|---|---|---|"]
    for p, by_mode in doc["summary"].items():
        for mode, s in by_mode.items():
            lo, hi = s["ci95"]
            lines.append(f"| {p} | {mode} | {_fmt(s['success_rate'])} | [{lo:.2f}, {hi:.2f}] | {s['episodes']} |")
    for mode in doc["modes"]:
        if f"success_{mode}" in plots:
            lines += ["", f"![joint success {mode}]({plots[f'success_{mode}']})"]
    if "rating" in doc:
        r = doc["rating"]
        lines += ["", "## Ratings (competitive games, pooled)", "",
                  f"Elo-scale ratings from {r['matches']} seat-rotated matches over {', '.join(r['environments'])}: "
                  "each pair of policies plays every task with each policy in every seat; the higher payoff wins "
                  "the match. Bradley-Terry (Elo) fit with a Gaussian prior (1500 ± 350); ± is one standard "
                  "deviation of the posterior.", ""] + _rating_table(r["ratings"])
        if "rating" in plots:
            lines += ["", f"![ratings]({plots['rating']})"]
    for e in doc["environments"]:
        lines += ["", f"## {e['name']} ({e['domain']})", "", e["description"], "",
                  f"Agents: {', '.join(e['agents'])}; tasks: {e['tasks']}; mixed motive: {e['mixed_motive']}.", "",
                  "| policy | mode | success [95% CI] | rounds to success | messages / success | redundant / ep "
                  "| conflicts / ep | permission errors / ep | mean reward per agent |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p, t in e["teams"].items():
            for mode in doc["modes"]:
                m = t[mode]
                lo, hi = m["ci95"]
                rewards = ", ".join(f"{a}={_fmt(v)}" for a, v in m["reward"].items())
                lines.append(f"| {p} | {mode} | {_fmt(m['success_rate'])} [{lo:.2f}, {hi:.2f}] | "
                             f"{_fmt(m['rounds_to_success'])} | {_fmt(m['messages_per_success'])} | "
                             f"{_fmt(m['redundant_per_episode'])} | {_fmt(m['conflicts_per_episode'])} | "
                             f"{_fmt(m['permission_errors_per_episode'])} | {rewards} |")
        lines += ["", "Contribution (team success minus success with the agent replaced by a no-op, AEC):", "",
                  "| team | " + " | ".join(e["agents"]) + " |", "|---|" + "---|" * len(e["agents"])]
        for p, c in e["contribution"].items():
            lines.append(f"| {p} | " + " | ".join(_fmt(c[a]["contribution"]) for a in e["agents"]) + " |")
        pols = list(e["cross_play"])
        lines += ["", "Cross-play (row: one role's policy; column: the others'; success, AEC):", "",
                  "| | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
        for r in pols:
            lines.append(f"| **{r}** | " + " | ".join(_fmt(e["cross_play"][r][c]) for c in pols) + " |")
        if "rating" in e:
            h2h = e["rating"]["head_to_head"]
            lines += ["", f"Rating ({e['rating']['matches']} seat-rotated matches, AEC):", ""]
            lines += _rating_table(e["rating"]["ratings"])
            lines += ["", "Head to head (row against column: wins / draws / losses of the row):", "",
                      "| | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
            for a in pols:
                cells = []
                for b in pols:
                    c = h2h.get(a, {}).get(b)
                    back = h2h.get(b, {}).get(a)
                    if c:
                        cells.append(f"{c['wins']} / {c['draws']} / {c['losses']}")
                    elif back:
                        cells.append(f"{back['losses']} / {back['draws']} / {back['wins']}")
                    else:
                        cells.append("–")
                lines.append(f"| **{a}** | " + " | ".join(cells) + " |")
        for key in (f"cross_{e['name']}", f"contrib_{e['name']}", f"rating_{e['name']}"):
            if key in plots:
                lines += ["", f"![{key}]({plots[key]})"]
    return "\n".join(lines) + "\n"


def _png_plots(doc: dict[str, Any], out: Path) -> dict[str, str]:
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
    return {"success": "success.png", "episodes": "episodes.png"}


def agent_markdown(doc: dict[str, Any], plots: dict[str, str]) -> str:
    """The single-agent report's markdown text; ``plots`` maps a plot key to its relative path."""
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
    lines += [f"![{name}]({name})" for name in plots.values()]
    if not plots:
        lines.append("\n_Plots skipped: matplotlib is not installed (pip install 'envfactory[eval]')._\n")
    failed = [r for r in doc["episodes"] if r["error"]]
    if failed:
        lines += ["", "## Failed episodes", ""] + [f"- {r['env']} {r['task']}: {r['error']}" for r in failed[:50]]
    return "\n".join(lines) + "\n"


def _svg_plots(doc: dict[str, Any], out: Path) -> dict[str, str]:
    (out / "plots").mkdir(exist_ok=True)
    plots: dict[str, str] = {}

    def save(key: str, name: str, svg: str) -> None:
        (out / "plots" / name).write_text(svg)
        plots[key] = f"plots/{name}"

    for mode in doc["modes"]:
        save(f"success_{mode}", f"success_{mode}.svg", success_chart(doc, mode))
    for e in doc["environments"]:
        save(f"cross_{e['name']}", f"crossplay_{e['name']}.svg", heatmap(e))
        team = "oracle" if "oracle" in e["contribution"] else next(iter(e["contribution"]))
        save(f"contrib_{e['name']}", f"contribution_{e['name']}.svg", contribution_chart(e, team))
        if "rating" in e:
            save(f"rating_{e['name']}", f"rating_{e['name']}.svg",
                 rating_chart(e["rating"]["ratings"], f"{e['name']}: ratings, 95% CI"))
    if "rating" in doc:
        save("rating", "rating.svg", rating_chart(doc["rating"]["ratings"], "Ratings over the competitive games, 95% CI"))
    return plots


def write_report(doc: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """Write the evaluation ``doc`` (a team's or a single agent's) as JSON, markdown and plots
    into ``out_dir``; return their paths (``json``, ``markdown`` and one per plot)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    team = "summary" in doc
    json_name, md_name = ("team_eval.json", "team_eval.md") if team else ("results.json", "report.md")
    (out / json_name).write_text(json.dumps(doc, indent=2))
    if team:
        plots = _svg_plots(doc, out)
    else:
        try:
            plots = _png_plots(doc, out)
        except ImportError:
            plots = {}
    (out / md_name).write_text(markdown(doc, plots) if team else agent_markdown(doc, plots))
    return {"json": str(out / json_name), "markdown": str(out / md_name),
            **{k: str(out / v) for k, v in plots.items()}}
