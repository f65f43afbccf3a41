"""FileSystem-v0: organise, read and edit files in a small user's home and server tree."""

from __future__ import annotations

from envfactory import ToolEnvSpec, State, Task, call, register
from envfactory.factory.tasks.synthesis import SynthConfig, synthesize
from tools.filesystem import TOOLS, FileTree


class FileSystemState(State):
    fs: FileTree


LOG = "\n".join(
    [
        "2026-11-01 10:00:01 INFO service started",
        "2026-11-01 10:02:13 ERROR disk quota exceeded on /srv/data",
        "2026-11-01 10:05:40 INFO request served in 41ms",
        "2026-11-01 10:07:02 WARN slow response from db",
        "2026-11-01 10:09:55 ERROR connection reset by peer",
        "2026-11-01 10:12:30 INFO request served in 37ms",
        "2026-11-01 10:15:12 ERROR timeout talking to payments",
    ]
)


def world() -> FileSystemState:
    return FileSystemState(
        fs=FileTree.build(
            {
                "/home/user/notes/todo.txt": "Move /home/user/inbox/report.txt into /home/user/archive/",
                "/home/user/notes/shopping.txt": "milk\neggs\ncoffee",
                "/home/user/notes/ideas.md": "# Ideas\nquarterly review deck\nrewrite the backup script",
                "/home/user/docs/readme.md": "Project Falcon\nOwner: dana\nStatus: active",
                "/home/user/docs/config.ini": "[output]\noutput_dir=/srv/out\nretention_days=14",
                "/home/user/docs/budget.csv": "item,amount\nservers,1200\nlicenses,300\ntravel,450",
                "/home/user/inbox/report.txt": "Q3 report: revenue up 12%",
                "/home/user/inbox/invoice-17.txt": "Invoice 17: 450 EUR, due 2026-12-01",
                "/home/user/inbox/invoice-18.txt": "Invoice 18: 120 EUR, due 2026-12-15",
                "/home/user/inbox/meeting.txt": "Meeting moved to Thursday 14:00",
                "/srv/logs/app.log": LOG,
                "/tmp/cache-1.tmp": "stale",
                "/tmp/cache-2.tmp": "stale",
                "/tmp/keep.txt": "do not delete",
            },
            dirs=("/home/user/archive", "/srv/out"),
        )
    )


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(instruction: str, solution: list, facts: list[str] | None = None, *, computed: bool = False) -> None:
        # computed: the answer is worked out from what was read (a total), not read itself
        out.append(
            Task(
                id=f"fs-{len(out):03d}",
                instruction=instruction,
                initial_state=world(),
                solution=solution,
                answer_facts=facts or [],
                answer_seen=not computed,
            )
        )

    # -- 1 call: read and report -------------------------------------------------
    add("Who is the owner of Project Falcon? The answer is in /home/user/docs/readme.md.",
        [call("read_file", path="/home/user/docs/readme.md")], ["dana"])
    add("When is invoice 17 due? Look in /home/user/inbox/invoice-17.txt.",
        [call("read_file", path="/home/user/inbox/invoice-17.txt")], ["2026-12-01"])
    add("What day was the meeting moved to? Check /home/user/inbox/meeting.txt.",
        [call("read_file", path="/home/user/inbox/meeting.txt")], ["Thursday"])
    add("Which file under /home/user mentions 'quarterly'? Answer with its full path.",
        [call("search_text", directory="/home/user", text="quarterly")], ["/home/user/notes/ideas.md"])
    add("How many .tmp files are there under /tmp? Answer with the number.",
        [call("find_files", directory="/tmp", pattern="*.tmp")], ["2"])
    # -- 1 call: change the world -----------------------------------------------
    add("Create the file /tmp/hello.txt containing exactly: hello world",
        [call("write_file", path="/tmp/hello.txt", content="hello world")])
    add("Delete /tmp/cache-1.tmp.", [call("delete_file", path="/tmp/cache-1.tmp")])
    add("Add a line 'bread' to the end of /home/user/notes/shopping.txt (append '\\nbread').",
        [call("append_file", path="/home/user/notes/shopping.txt", content="\nbread")])
    add("Rename /home/user/inbox/meeting.txt to /home/user/inbox/meeting-thursday.txt.",
        [call("move_file", source="/home/user/inbox/meeting.txt",
              destination="/home/user/inbox/meeting-thursday.txt")])
    add("Make a backup copy of /home/user/docs/budget.csv at /home/user/docs/budget.bak.csv.",
        [call("copy_file", source="/home/user/docs/budget.csv", destination="/home/user/docs/budget.bak.csv")])
    # -- 2 calls, the second depends on what the first reveals --------------------
    add("Read /home/user/notes/todo.txt and do exactly what it says.",
        [call("read_file", path="/home/user/notes/todo.txt"),
         call("move_file", source="/home/user/inbox/report.txt", destination="/home/user/archive/")])
    add("Find the output directory configured in /home/user/docs/config.ini and create a file "
        "named status.txt in it containing exactly: ok",
        [call("read_file", path="/home/user/docs/config.ini"),
         call("write_file", path="/srv/out/status.txt", content="ok")])
    add("Count the lines containing ERROR in /srv/logs/app.log and write just that number to "
        "/srv/logs/error_count.txt.",
        [call("read_file", path="/srv/logs/app.log"),
         call("write_file", path="/srv/logs/error_count.txt", content="3")])
    add("Delete every .tmp file under /tmp (and nothing else).",
        [call("find_files", directory="/tmp", pattern="*.tmp"),
         call("delete_file", path="/tmp/cache-1.tmp"), call("delete_file", path="/tmp/cache-2.tmp")])
    add("What is the total of the amounts in /home/user/docs/budget.csv? Answer with the number.",
        [call("read_file", path="/home/user/docs/budget.csv")], ["1950"], computed=True)
    # -- 3 calls ------------------------------------------------------------------
    add("Create the directory /home/user/invoices and move both invoice files from "
        "/home/user/inbox into it.",
        [call("make_dir", path="/home/user/invoices"),
         call("move_file", source="/home/user/inbox/invoice-17.txt", destination="/home/user/invoices"),
         call("move_file", source="/home/user/inbox/invoice-18.txt", destination="/home/user/invoices")])
    add("Copy the last ERROR line of /srv/logs/app.log into a new file /srv/out/last_error.txt "
        "(the line exactly, no newline), then delete /tmp/keep.txt.",
        [call("read_file", path="/srv/logs/app.log"),
         call("write_file", path="/srv/out/last_error.txt",
              content="2026-11-01 10:15:12 ERROR timeout talking to payments"),
         call("delete_file", path="/tmp/keep.txt")])
    add("Change retention_days in /home/user/docs/config.ini from 14 to 30, keeping the rest of "
        "the file identical, and put a copy of the new file at /srv/out/config.ini.",
        [call("read_file", path="/home/user/docs/config.ini"),
         call("write_file", path="/home/user/docs/config.ini",
              content="[output]\noutput_dir=/srv/out\nretention_days=30"),
         call("copy_file", source="/home/user/docs/config.ini", destination="/srv/out/config.ini")])
    # -- 4 and more ---------------------------------------------------------------
    add("Archive the inbox: create /home/user/archive/2026 and move every file from "
        "/home/user/inbox into it.",
        [call("make_dir", path="/home/user/archive/2026"),
         call("list_dir", path="/home/user/inbox"),
         call("move_file", source="/home/user/inbox/invoice-17.txt", destination="/home/user/archive/2026"),
         call("move_file", source="/home/user/inbox/invoice-18.txt", destination="/home/user/archive/2026"),
         call("move_file", source="/home/user/inbox/meeting.txt", destination="/home/user/archive/2026"),
         call("move_file", source="/home/user/inbox/report.txt", destination="/home/user/archive/2026")])
    add("Write the due dates of invoices 17 and 18 into /home/user/notes/due.txt, one per line in "
        "the form 'invoice-17: YYYY-MM-DD' then 'invoice-18: YYYY-MM-DD', then delete both invoice "
        "files.",
        [call("read_file", path="/home/user/inbox/invoice-17.txt"),
         call("read_file", path="/home/user/inbox/invoice-18.txt"),
         call("write_file", path="/home/user/notes/due.txt",
              content="invoice-17: 2026-12-01\ninvoice-18: 2026-12-15"),
         call("delete_file", path="/home/user/inbox/invoice-17.txt"),
         call("delete_file", path="/home/user/inbox/invoice-18.txt")])
    add("Clean up /tmp: delete every .tmp file there, then move /tmp/keep.txt to "
        "/home/user/notes/keep.txt, and append the line 'tmp cleaned' (with a leading newline) to "
        "/home/user/notes/todo.txt.",
        [call("find_files", directory="/tmp", pattern="*.tmp"),
         call("delete_file", path="/tmp/cache-1.tmp"),
         call("delete_file", path="/tmp/cache-2.tmp"),
         call("move_file", source="/tmp/keep.txt", destination="/home/user/notes/keep.txt"),
         call("append_file", path="/home/user/notes/todo.txt", content="\ntmp cleaned")])
    add("Set up a report folder: create /srv/out/reports, copy /home/user/inbox/report.txt there, "
        "copy /home/user/docs/budget.csv there, write /srv/out/reports/index.txt listing the two "
        "file names on separate lines (report.txt first, then budget.csv), and finally delete the "
        "original report from the inbox.",
        [call("make_dir", path="/srv/out/reports"),
         call("copy_file", source="/home/user/inbox/report.txt", destination="/srv/out/reports"),
         call("copy_file", source="/home/user/docs/budget.csv", destination="/srv/out/reports"),
         call("write_file", path="/srv/out/reports/index.txt", content="report.txt\nbudget.csv"),
         call("delete_file", path="/home/user/inbox/report.txt")])
    add("Which ERROR in /srv/logs/app.log happened at 10:09:55? Write its message (the text after "
        "'ERROR ') into /srv/out/incident.txt and report it.",
        [call("search_text", directory="/srv/logs", text="10:09:55"),
         call("write_file", path="/srv/out/incident.txt", content="connection reset by peer")],
        ["connection reset by peer"])
    return out + synthesize(SPEC.all_tools, SYNTH, n=SYNTHESIZED, seed=0)


# Tasks beyond the hand-written ones are synthesized by walking the tools (envfactory.factory).
SYNTHESIZED = 40
SYNTH = SynthConfig(
    sample_state=lambda rng: world(),
    arguments={
        "path": "keys:fs.files", "write_file.path": ["/tmp/notes.txt", "/srv/out/summary.txt",
                                                    "/home/user/notes/plan.md", "/home/user/todo2.txt"],
        "make_dir.path": ["/home/user/projects", "/srv/backup", "/tmp/scratch"],
        "source": "keys:fs.files", "destination": "values:fs.dirs.*", "directory": "values:fs.dirs.*",
        "content": ["hello", "draft v2", "remember the milk", "status: done"],
        "append_file.content": ["\nchecked", "\nreviewed by dana"],
        "pattern": ["*.txt", "*.tmp", "*.md"], "text": ["ERROR", "invoice", "Owner"],
    },
    read_share=0.0, prefix="fssyn",
)

SPEC = register(
    ToolEnvSpec(
        name="FileSystem-v0",
        domain="filesystem",
        description="Organise, read and edit files in a user's home and a server tree.",
        state_type=FileSystemState,
        tools=TOOLS,
        tasks=tasks,
        metadata={"synth": SYNTH},
        max_turns=20,
    )
)
