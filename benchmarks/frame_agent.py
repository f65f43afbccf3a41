"""A frame-keyed scripted agent: how far regular expressions over the task frames go, with no learning.

    python -m benchmarks.frame_agent                   # every family's eval split (see RESULTS.md)
    python -m benchmarks.frame_agent --families 5      # the first five families only

Issue 26 says an agent trained here could learn the goal-level kinds' sentence frames instead of
tool use. This measures it: :class:`FrameAgent` reads only what a model reads (the instruction, the
system prompt's policy lines, the tool schemas and the tool outputs), matches the instruction to one
of the frames with regular expressions, and fills the frame from the schemas (which tool lists which
rows, which tool a verb names, by shared words) and the outputs (``order O-5: customer=C-5, ...``
rows). It plays through :func:`envfactory.make` and the episode API under the environment's own turn
limit, on the eval split of every table-backed family. The issue's goal is that it solves at most
20% of goal-level tasks; the share it solves is what this prints (overall, per kind, per family).

Writes ``benchmarks/results/frame-agent-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

GOAL_KINDS = ("lookup", "answer", "conditional", "user", "policy", "multi_service",
              # the task grammar's compositional kinds: attempted with the frames above, for which
              # no frame of their own was written (the agent is keyed to the old sentence frames)
              "chain", "aggregate", "exception", "recovery")

_ROW = re.compile(r"^(?:Updated )?([a-z][a-z _]*?) (\S+): (.*)$")
_FIELD = re.compile(r"(\w+)=(.*?)(?=, \w+=|$)")
_NEXT_PAGE = re.compile(r"call again with page=(\d+) for more\s*$")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = {"it", "the", "a", "an", "of", "to", "for", "as", "with", "on", "at", "its", "and", "every", "is"}
_ID = re.compile(r"^[A-Z]{1,4}-?\d+$")


class FrameError(Exception):
    """The instruction fits no frame, or a frame's words name no tool or row."""


def rows_of(text: str) -> list[dict[str, str]]:
    """The rows a tool output lists (``entity ID: field=value, ...`` lines): ``{"id": ID, field: value}``."""
    out = []
    for line in text.splitlines():
        m = _ROW.match(line.strip())
        if m:
            out.append({"id": m.group(2), **{k: v for k, v in _FIELD.findall(m.group(3))},
                        "_entity": m.group(1).strip().replace(" ", "_")})
    return out


def _stem(word: str) -> str:
    for end in ("ing", "ed", "es", "s"):
        if len(word) > len(end) + 2 and word.endswith(end):
            word = word[:-len(end)]
            break
    return word[:5]


def _stems(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP}


def _num(v: Any) -> float | None:
    try:
        return float(str(v).replace("$", "").replace(",", ""))
    except ValueError:
        return None


def _plural_of(word: str) -> list[str]:
    return [word + "s", word + "es", word[:-1] + "ies" if word.endswith("y") else word + "s"]


class FrameAgent:
    """Solves the task of a live single-agent episode (after ``reset``) by its frame (see the module docstring)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.tools = {fn["function"]["name"]: fn["function"] for fn in env.tool_schemas()}
        self.queries = {n: f for n, f in self.tools.items() if re.match(r"(search|list|find)_", n)}
        self.reads = {n: f for n, f in self.tools.items() if n.startswith("get_")}
        self.acts = {n: f for n, f in self.tools.items() if n not in self.queries and n not in self.reads
                     and n not in ("ask_user", "finish") and any(p.endswith("_id") for p in self._params(f))}
        system = str(env.transcript()[0]["content"])
        self.policies = [line[2:] for line in system.splitlines() if line.startswith("- ")]

    # -- the episode ----------------------------------------------------------------
    @staticmethod
    def _params(fn: dict[str, Any]) -> dict[str, Any]:
        return fn.get("parameters", {}).get("properties", {})

    def call(self, name: str, args: dict[str, Any]) -> str:
        if self.env.done:
            raise FrameError("out of turns")
        res = self.env.step(f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>')
        return "\n".join(str(m["content"]) for m in res.messages if m.get("role") == "tool")

    def listing(self, name: str, args: dict[str, Any]) -> list[dict[str, str]]:
        """The rows a query lists, over every page it has (the output's last line names the next)."""
        text = self.call(name, args)
        rows = rows_of(text)
        while (more := _NEXT_PAGE.search(text)) is not None:
            text = self.call(name, {**args, "page": int(more.group(1))})
            rows += rows_of(text)
        return rows

    def play(self) -> bool:
        """Plays the episode to its end; whether it succeeded."""
        instruction = str(self.env.transcript()[-1]["content"]).strip()
        try:
            answer = self.solve(instruction)
        except FrameError:
            answer = "I could not do it."
        if not self.env.done:
            self.env.step(answer or "Done.")
        return bool(self.env.success)

    # -- the frames -----------------------------------------------------------------
    def solve(self, text: str) -> str | None:
        m = re.match(r"Hi, I'm an? ([a-z ]+?) here\. Please (.*?)\. Ask me for anything", text, re.S)
        if m:
            return self._user(m.group(1), m.group(2))
        m = re.match(r"Check the ([a-z ]+?) of the ([a-z ]+?) named (.+?) in the .+? records\. If it is at least "
                     r"([\d.]+), (.+?) in the .+? records; otherwise (.+?) there\.$", text, re.S)
        if m:
            value = self._value_of(m.group(2), m.group(3), m.group(1))
            return self._act_on_every(m.group(5) if value is not None and value >= float(m.group(4)) else m.group(6))
        m = re.match(r"In the .+? records, look up the ([a-z ]+?) of the ([a-z ]+?) named (.+?)\. Then, in the .+? "
                     r"records, (.+) to the ([a-z ]+?) you found\.$", text, re.S)
        if m:
            value = self._value_of(m.group(2), m.group(3), m.group(1))
            shown = "none" if value is None else (str(int(value)) if value == int(value) else str(value))
            return self._act_on_every(f"{m.group(4)} to {shown}")
        m = re.match(r"For (every .+?): if its (.+?) is at least ([\d.]+), (.+?); otherwise (.+?)\.$", text, re.S)
        if m:
            return self._conditional(m.group(1), m.group(2), float(m.group(3)), m.group(4), m.group(5))
        m = re.match(r"How many ([a-z ]+?)s( .*)? are there\?$", text)
        if m:
            return str(len(self._select(f"every {m.group(1)}{m.group(2) or ''}")[0]))
        m = re.match(r"What is the total ([a-z ]+?) of (every .+)\?$", text)
        if m:
            rows = self._select(m.group(2))[0]
            total = sum(_num(r.get(self._key(m.group(1), r))) or 0 for r in rows)
            return str(int(total)) if total == int(total) else str(round(total, 2))
        m = re.match(r"Of (every .+?), which one (?:has|is for the ([a-z ]+?) with) the highest ([a-z ]+?)\? "
                     r"Answer with its id\.$", text)
        if m:
            rows = self._select(m.group(1))[0]
            if m.group(2):
                score = {r["id"]: self._through(r, m.group(2), m.group(3)) for r in rows}
            else:
                score = {r["id"]: _num(r.get(self._key(m.group(3), r))) for r in rows}
            got = {k: v for k, v in score.items() if v is not None}
            return max(got, key=lambda k: got[k]) if got else None
        if "every " in text:
            return self._act_on_every(text.rstrip("."))
        raise FrameError(f"no frame fits {text!r}")

    def _user(self, who: str, request: str) -> str | None:
        name_reply = self.call("ask_user", {"question": "What is your name?"})
        m = re.search(r"My name is (.+?)\.", name_reply)
        if not m:
            raise FrameError("the user gave no name")
        request = request.replace(" of mine", f" of the {who} named {m.group(1)}")
        m2 = re.search(r" with the ([a-z ]+?) I have in mind", request)
        if m2:
            reply = self.call("ask_user", {"question": f"Which {m2.group(1)} do you have in mind?"})
            got = re.search(rf"My {m2.group(1)} is (.+?)\.", reply) or re.search(r"is (.+?)\.", reply)
            if not got:
                raise FrameError("the user gave no value")
            request = request.replace(m2.group(0), f" whose {m2.group(1)} is {got.group(1)}")
        return self._act_on_every(request)

    # -- selections: "every <entity> [of ...] [whose <field> is <value> [and ...]]" --------
    def _entity_query(self, words: str) -> tuple[str, str, str] | None:
        """The longest entity label that ``words`` start with, its query tool and the rest of ``words``."""
        best = None
        for name in self.queries:
            plural = name.split("_", 1)[1]
            for label in {plural[:-3] + "y", plural[:-2], plural[:-1]}:
                said = label.replace("_", " ")
                if (words + " ").startswith(said + " ") and (best is None or len(said) > len(best[0])
                                                             or (len(said) == len(best[0]) and name.startswith("search"))):
                    best = (said, name, words[len(said):])
        return best

    def _select(self, text: str) -> tuple[list[dict[str, str]], str]:
        """The rows ``every ...`` at the start of ``text`` selects, and the words after the selection."""
        m = re.match(r"every (.*)$", text.strip(), re.S)
        if not m:
            raise FrameError(f"no selection in {text!r}")
        found = self._entity_query(m.group(1))
        if found is None:
            raise FrameError(f"no tool lists {m.group(1)!r}")
        _, query, rest = found
        args: dict[str, Any] = {}
        want: dict[str, str] = {}
        while True:
            ref = re.match(r" of the ([a-z ]+?) named ([A-Z][\w'.-]*(?: [A-Z][\w'.-]*)*)", rest)
            ref_id = re.match(r" of ([a-z ]+?) ([A-Z]{1,4}-?\d+)\b", rest)
            if ref:
                want[self._ref_field(ref.group(1), query)] = self._find(ref.group(1), ref.group(2))
                rest = rest[ref.end():]
            elif ref_id:
                want[self._ref_field(ref_id.group(1), query)] = ref_id.group(2)
                rest = rest[ref_id.end():]
            else:
                break
        params = self._params(self.queries[query])
        for k, v in want.items():
            if k in params:
                args[k] = v
        rows = self.listing(query, args)
        rows = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
        conds = re.match(r" whose (.*)$", rest, re.S)
        if conds:
            rest = conds.group(1)
            while True:
                cm = re.match(r"([a-z ]+?) is (.*)$", rest, re.S)
                if not cm:
                    break
                key = self._key(cm.group(1), rows[0] if rows else {})
                values = sorted({r.get(key, "") for r in rows}, key=len, reverse=True)
                value = next((v for v in values if (cm.group(2) + " ").lower().startswith(v.lower() + " ")
                              or cm.group(2).lower() == v.lower()), None)
                if value is None:
                    value = cm.group(2).split()[0] if cm.group(2).split() else ""
                rows = [r for r in rows if r.get(key, "").lower() == value.lower()]
                rest = cm.group(2)[len(value):]
                nxt = re.match(r" and (.*)$", rest, re.S)
                if not nxt:
                    break
                rest = nxt.group(1)
        return rows, rest

    def _find(self, label: str, name: str) -> str:
        return self._find_row(label, name)["id"]

    def _find_row(self, label: str, name: str) -> dict[str, str]:
        """The row of the ``label`` named ``name``, through that entity's ``find_`` tool."""
        tool = next((n for n in self.queries if n.startswith("find_") and n[5:] in
                     [p.replace(" ", "_") for p in _plural_of(label.split()[-1]) + _plural_of(label)]), None)
        if tool is None:
            raise FrameError(f"no tool finds a {label}")
        rows = [r for r in self.listing(tool, {"name": name}) if r.get("name", "").lower() == name.lower()]
        if not rows:
            raise FrameError(f"no {label} named {name}")
        return rows[0]

    def _ref_field(self, label: str, query: str) -> str:
        params = self._params(self.queries[query])
        for cand in (label.replace(" ", "_"), label.split()[-1]):
            if cand in params:
                return cand
        for p, s in params.items():
            if label.split()[-1] in str(s.get("description", "")):
                return p
        return label.split()[-1]

    @staticmethod
    def _key(phrase: str, row: dict[str, str]) -> str:
        """The row field a phrase names ("party size" -> party_size), by exact name, else most shared words."""
        key = phrase.strip().replace(" ", "_")
        if key in row or not row:
            return key
        words = set(phrase.split())
        return max(row, key=lambda k: len(words & set(k.split("_"))))

    def _value_of(self, label: str, name: str, field: str) -> float | None:
        row = self._find_row(label, name)
        return _num(row.get(self._key(field, row)))

    def _through(self, row: dict[str, str], label: str, field: str) -> float | None:
        """A value of the row ``row`` refers to ("its product's stock"), read with that row's get tool."""
        ref = self._key(label, row)
        target = row.get(ref)
        read = next((n for n in self.reads if n[4:] in (label.replace(" ", "_"), label.split()[-1], ref)), None)
        if target is None or read is None:
            return None
        idp = next(iter(self._params(self.reads[read])))
        got = rows_of(self.call(read, {idp: target}))
        return _num(got[0].get(self._key(field, got[0]))) if got else None

    # -- acting -------------------------------------------------------------------------
    def _act_on_every(self, text: str) -> str | None:
        """``<verb words> every <selection> <verb words>``: the selected rows, each acted on as the words say."""
        m = re.search(r"\bevery ", text)
        if not m:
            raise FrameError(f"no 'every' in {text!r}")
        head = text[:m.start()]
        rows, tail = self._select(text[m.start():])
        verb = f"{head} it{tail}"
        for row in rows:
            self._act(verb, row)
        return "Done."

    def _conditional(self, sel: str, what: str, threshold: float, yes: str, no: str) -> str | None:
        rows, _ = self._select(sel)
        seen: dict[tuple[str, str], float | None] = {}
        for row in rows:
            if "'s " in what:
                label, field = what.split("'s ", 1)
                key = (label, row.get(self._key(label, row), ""))
                if key not in seen:
                    seen[key] = self._through(row, label, field)
                value = seen[key]
            else:
                value = _num(row.get(self._key(what, row)))
            self._act(yes if value is not None and value >= threshold else no, row)
        return "Done."

    def _act(self, verb: str, row: dict[str, str]) -> None:
        tool = self._verb_tool(verb, row.get("_entity"))
        fn = self.tools[tool]
        args: dict[str, Any] = {}
        numbers = [n for n in re.findall(r"\$?(-?\d+(?:\.\d+)?)", re.sub(r"'[^']*'", "", verb))]
        quoted = re.findall(r"'([^']*)'", verb)
        for p, s in self._params(fn).items():
            if p.endswith("_id"):
                args[p] = row["id"]
                continue
            options = s.get("enum") or next((o.get("enum") for o in s.get("anyOf", []) if o.get("enum")), None)
            kind = s.get("type") or next((o.get("type") for o in s.get("anyOf", []) if o.get("type") != "null"), None)
            if options:
                said = [o for o in options if re.search(rf"\b{re.escape(str(o).replace('_', ' '))}\b", verb.replace("_", " "))]
                if said:
                    args[p] = max(said, key=lambda o: len(str(o)))
            elif kind in ("integer", "number") and numbers:
                n = float(numbers.pop(0))
                args[p] = int(n) if kind == "integer" and n == int(n) else n
            elif kind == "string" and quoted:
                args[p] = quoted.pop(0)
            elif kind == "string":
                after = re.search(rf"\b{re.escape(p.replace('_', ' '))} (\S+)", verb)
                if after:
                    args[p] = after.group(1).strip("(),.")
        if any(self._forbids(rule, tool, row) for rule in self.policies):
            return
        self.call(tool, args)

    def _verb_tool(self, verb: str, entity: str | None = None) -> str:
        """The acting tool whose name (then description) shares the most words with ``verb``, among
        those that take an ``<entity>_id`` when any does."""
        words = _stems(verb)
        acts = [n for n in self.acts if f"{entity}_id" in self._params(self.acts[n])] or list(self.acts)
        if not acts:
            raise FrameError("no tool acts on a row")
        return max(acts, key=lambda n: (len(words & _stems(n.replace("_", " "))),
                                        len(words & _stems(self.acts[n].get("description", "")))))

    def _forbids(self, rule: str, tool: str, row: dict[str, str]) -> bool:
        """Whether acting with ``tool`` on ``row`` breaks a policy line: the frame ``Never <verb> any
        <entity> whose <field> is <value>``, or a threshold (``above``/``more than``/``over`` N) on
        the numeric field that shares the most words with the line, and a verb after ``never``."""
        m = re.match(r"Never (.+?) any [a-z ]+? whose ([a-z ]+?) is (\S+?)[,.]", rule)
        if m and not m.group(3)[0].isdigit() and m.group(3) != "above":
            if self._verb_tool(m.group(1), row.get("_entity")) != tool:
                return False
            return str(row.get(self._key(m.group(2), row), "")).lower() == m.group(3).lower()
        verb = re.search(r"never (.+?)(?: any | one| it\b| them\b| yourself|,|\.|$)", rule, re.I)
        limit = re.search(r"(?:above|more than|over) \$?(-?\d+(?:\.\d+)?)", rule)
        if not verb or not limit or self._verb_tool(verb.group(1), row.get("_entity")) != tool:
            return False
        words = _stems(rule)
        numeric = [k for k, v in row.items() if k not in ("id", "_entity") and _num(v) is not None]
        shared = [k for k in numeric if words & _stems(k.replace("_", " "))]
        if not shared:
            return False
        key = max(shared, key=lambda k: len(words & _stems(k.replace("_", " "))))
        got = _num(row[key])
        return got is not None and got > float(limit.group(1))


def families() -> list[str]:
    """The table-backed families with goal-level tasks (those with a task supply), sorted."""
    import envfactory

    return sorted(s.name for s in envfactory.specs() if (getattr(s, "metadata", None) or {}).get("supply") is not None)


def solve(name: str, task: Any) -> bool:
    """Whether the frame agent solves ``task`` of ``name`` (one episode, the environment's turn limit)."""
    import envfactory

    env = envfactory.make(name, split="all")
    try:
        env.reset(task)
        return FrameAgent(env).play()
    finally:
        env.close()


def _share(tallies: list[list[int]]) -> dict[str, Any]:
    solved, total = sum(t[0] for t in tallies), sum(t[1] for t in tallies)
    return {"solved": solved, "tasks": total, "share": round(solved / total, 4) if total else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import envfactory

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", type=int, default=None, help="only the first N families")
    p.add_argument("--split", default="eval", help="the split played (default eval)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    names = families()[: a.families]
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_family: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name in names:
        for t in envfactory.spec(name).tasks_in(a.split):
            if t.kind not in GOAL_KINDS:
                continue
            ok = solve(name, t)
            for tally in (by_kind[t.kind], by_family[name]):
                tally[0] += ok
                tally[1] += 1
    solved, total = sum(v[0] for v in by_kind.values()), sum(v[1] for v in by_kind.values())
    res = {
        "benchmark": "frame_agent", "split": a.split, "families": len(names), "tasks": total, "solved": solved,
        "share": round(solved / total, 4) if total else None, "goal": "<= 0.20 (issue 26)",
        "heldout_families": _share([by_family[n] for n in names if n in envfactory.HELDOUT_FAMILIES]),
        "seen_families": _share([by_family[n] for n in names if n not in envfactory.HELDOUT_FAMILIES]),
        "by_kind": {k: {"solved": v[0], "tasks": v[1], "share": round(v[0] / v[1], 4)} for k, v in sorted(by_kind.items())},
        "by_family": {k: {"solved": v[0], "tasks": v[1]} for k, v in sorted(by_family.items())},
        "seconds": round(time.perf_counter() - t0, 1), "load": [round(x, 2) for x in os.getloadavg()],
    }
    out = Path(a.out or f"benchmarks/results/frame-agent-{datetime.date.today().isoformat()}.json")
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"frame agent: {solved}/{total} goal-level {a.split} tasks ({res['share']:.1%}) over {len(names)} families")
    for k, v in res["by_kind"].items():
        print(f"  {k:14s} {v['solved']:4d}/{v['tasks']:<4d} {v['share']:.1%}")
    return res


if __name__ == "__main__":
    main()
