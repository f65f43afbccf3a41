"""A third-party MCP server as an envfactory environment: ``mcp-kb-sqlite`` (PyPI, MIT; a knowledge
base on SQLite FTS5, written by Eugene Kosyakov, not by this project), unchanged, imported with
:func:`envfactory.factory.from_mcp`, with 26 written tasks, then verified.

The server keeps its whole state in the SQLite file ``DB_PATH`` and opens it on every call, so
``restore="files"``: each process gets its own ``{state_dir}``, processes are pooled, and forks,
resets and snapshots copy that file. Its ``list`` orders entries by a timestamp of one-second
resolution, so the order of entries written within one second varies from run to run: no
reference solution and no check uses it (``get``, ``get_relations``, ``search`` and
``list_namespaces`` are deterministic). It reports failures as ordinary text ("Error: ...", "Not
found: ..."), which ``error_prefixes`` turns into tool errors, and prints dates, which ``scrub``
replaces so that episodes are the same on any day.

Run it: ``python examples/mcp/kb_env.py`` verifies the environment and plays one reference episode
(``--json`` for the report). Install the server with ``pip install 'envfactory[mcp]'``.
"""

from __future__ import annotations

import json
import sys

from envfactory import call, register
from envfactory.factory.from_mcp import from_mcp, mcp_task

NAME = "KnowledgeBase-v0"
SERVER = [sys.executable, "-m", "mcp_kb_sqlite.server"]


def _save(ns: str, key: str, title: str, **more):
    return call("save", ns=ns, key=key, title=title, **more)


WORK = [  # ids 1..5
    _save("proj/api", "auth", "Auth uses JWT tokens", tags=["auth", "security"], data="Tokens expire after 15 minutes."),
    _save("proj/api", "ratelimit", "Rate limit is 100 rps", description="throttling quota per client",
          data="Limit per client id."),
    _save("proj/db", "pool", "Pool size 20", data="max_connections=20 in prod"),
    _save("ops/deploy", "rollback", "Rollback via helm", data="helm rollback api 1"),
    _save("ops/oncall", "pager", "Pager rotation weekly", tags=["oncall"]),
]
HOME = [  # ids 1..4
    _save("home/garden", "tomatoes", "Water tomatoes daily", data="Use 2 litres per plant."),
    _save("home/garden", "roses", "Prune roses in March"),
    _save("home/kitchen", "bread", "Sourdough starter ratio", data="Feed it 1:1:1 flour, water and starter."),
    _save("work/meetings", "standup", "Standup at 9:30", tags=["daily"]),
]
LINKED = WORK + [call("relate", from_id=1, to_id=2, rel="see_also")]


def tasks():
    t = mcp_task
    return [
        # -- changes, checked through the server's own read tools -------------------------------
        t("kb-001", "Save a new entry in namespace proj/api with key 'cors' titled 'CORS allows app.example.com'.",
          [_save("proj/api", "cors", "CORS allows app.example.com")], call("get", id=6), setup=WORK),
        t("kb-002", "Record a new entry ops/deploy/canary titled 'Canary at 5 percent' with the tags deploy and canary.",
          [_save("ops/deploy", "canary", "Canary at 5 percent", tags=["deploy", "canary"])],
          call("get", id=6), setup=WORK),
        t("kb-003", "The database pool was resized: retitle the entry proj/db/pool to 'Pool size 40'.",
          [call("save", id=3, title="Pool size 40")], call("get", id=3), setup=WORK),
        t("kb-004", "Auth tokens now expire after 30 minutes, not 15: fix that in the data of the proj/api/auth entry.",
          [call("replace", id=1, old_string="15 minutes", new_string="30 minutes")],
          call("get", id=1, include_data=True), setup=WORK),
        t("kb-005", "Link the auth entry (proj/api/auth) to the rate-limit entry (proj/api/ratelimit) as see_also.",
          [call("relate", from_id=1, to_id=2, rel="see_also")], call("get_relations", id=1), setup=WORK),
        t("kb-006", "Mark the rollback entry (ops/deploy/rollback) as part_of the pager entry (ops/oncall/pager).",
          [call("relate", from_id=4, to_id=5, rel="part_of")], call("get_relations", id=4), setup=WORK),
        t("kb-007", "The pager rotation entry (ops/oncall/pager) is obsolete: delete it.",
          [call("delete", id=5)], call("list_namespaces"), setup=WORK),
        t("kb-008", "Tag the rate-limit entry (proj/api/ratelimit) with 'limits' and 'api'.",
          [call("save", id=2, tags=["limits", "api"])], call("get", id=2), setup=WORK),
        t("kb-009", "Move the rollback entry from namespace ops/deploy to ops/release (same key).",
          [call("save", id=4, ns="ops/release")], call("get", id=4), setup=WORK),
        t("kb-010", "Add an entry proj/db/migrations titled 'Migrations run on deploy' and relate it to the pool "
                    "entry (proj/db/pool) as part_of.",
          [_save("proj/db", "migrations", "Migrations run on deploy"), call("relate", from_id=6, to_id=3, rel="part_of")],
          call("get_relations", id=6), setup=WORK),
        t("kb-011", "Production now allows 50 connections: update max_connections in the data of proj/db/pool.",
          [call("replace", id=3, old_string="max_connections=20", new_string="max_connections=50")],
          call("get", id=3, include_data=True), setup=WORK),
        t("kb-012", "Remove every relation between the auth entry (proj/api/auth) and the rate-limit entry.",
          [call("relate", from_id=1, to_id=2, rel=None)], call("get_relations", id=1), setup=LINKED),
        t("kb-013", "Start a namespace team/alice with two entries: key 'focus' titled 'Search ranking' and key "
                    "'leave' titled 'Away in August'.",
          [_save("team/alice", "focus", "Search ranking"), _save("team/alice", "leave", "Away in August")],
          call("list_namespaces"), setup=WORK),
        t("kb-014", "Clear the description of the rate-limit entry (proj/api/ratelimit).",
          [call("save", id=2, description="")], call("search", query="throttling"), setup=WORK),
        t("kb-015", "Save an entry home/kitchen/pasta titled 'Salt the pasta water'.",
          [_save("home/kitchen", "pasta", "Salt the pasta water")], call("get", id=5), setup=HOME),
        t("kb-016", "Roses are pruned earlier now: retitle home/garden/roses to 'Prune roses in February'.",
          [call("save", id=2, title="Prune roses in February")], call("get", id=2), setup=HOME),
        t("kb-017", "Tomatoes need more water: change '2 litres' to '3 litres' in the data of home/garden/tomatoes.",
          [call("replace", id=1, old_string="2 litres", new_string="3 litres")],
          call("get", id=1, include_data=True), setup=HOME),
        t("kb-018", "The standup entry (work/meetings/standup) does not belong here: delete it.",
          [call("delete", id=4)], call("get", id=4), setup=HOME),
        t("kb-019", "Relate the bread entry (home/kitchen/bread) to the tomatoes entry as see_also.",
          [call("relate", from_id=3, to_id=1, rel="see_also")], call("get_relations", id=3), setup=HOME),
        t("kb-020", "Attach the data 'Water before 8am.' to the roses entry (home/garden/roses).",
          [call("save", id=2, data="Water before 8am.")], call("get", id=2, include_data=True), setup=HOME),
        # -- look-ups: the answer must carry a fact only the server's tools reveal; nothing may change
        t("kb-021", "What does the knowledge base say about the maximum number of database connections in prod? "
                    "Quote the setting.",
          [call("get", id=3, include_data=True)], call("list_namespaces"), setup=WORK, answer_facts=["max_connections=20"]),
        t("kb-022", "Which namespace holds the entry about rolling back a deploy?",
          [call("search", query="rollback")], call("list_namespaces"), setup=WORK, answer_facts=["ops/deploy"]),
        t("kb-023", "How long do auth tokens stay valid, according to the knowledge base?",
          [call("get", id=1, include_data=True)], call("list_namespaces"), setup=WORK, answer_facts=["15 minutes"]),
        t("kb-024", "What is the feeding ratio of the sourdough starter?",
          [call("get", id=3, include_data=True)], call("list_namespaces"), setup=HOME, answer_facts=["1:1:1"]),
        t("kb-025", "At what time is the standup meeting?",
          [call("search", query="standup")], call("list_namespaces"), setup=HOME, answer_facts=["9:30"]),
        t("kb-026", "What is the rate limit of the API, in requests per second?",
          [call("search", query="rate")], call("list_namespaces"), setup=WORK, answer_facts=["100 rps"]),
    ]


SPEC = register(from_mcp(
    SERVER, name=NAME, domain="knowledge-base", tasks=tasks, env={"DB_PATH": "{state_dir}/kb.db"},
    restore="files", error_prefixes=("Error", "Not found:", "Search failed:"),
    scrub=[(r"\d{4}-\d{2}-\d{2}", "<date>")],
    description="mcp-kb-sqlite (third-party MCP server): a SQLite FTS5 knowledge base",
), replace=True)


def main(argv: list[str]) -> int:
    from envfactory.checks.scripted import OraclePolicy, play
    from envfactory.factory.from_mcp import make_episode
    from envfactory.checks.verify import verify_spec

    report = verify_spec(SPEC, lambda: make_episode(SPEC)).to_json()
    ep = make_episode(SPEC)
    task = SPEC.get_tasks()[9]
    out = play(ep, OraclePolicy(), task.id)
    doc = {"verify": report, "example": {"task": task.id, "instruction": task.instruction, "reward": out.reward,
                                         "transcript": ep.transcript()[1:]}}
    ep.close()
    if "--json" in argv:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(f"{NAME}: {report['tasks']} tasks, verified={report['verified']} in {report['seconds']}s")
        for f in report["failures"]:
            print("  FAIL", f)
        print(f"{task.id}: {task.instruction} -> reward {out.reward}")
    return 0 if report["verified"] and out.reward == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
