"""A tiny version-control repository: a working tree, staging, commits and branches."""


class GitRepo:
    """A version-control repository with a working tree, an index, commits and branches."""

    def __init__(self, files=None, branches=None, head="main", commits=None):
        self.files = dict(files or {"README.md": "# demo", "app.py": "print('hi')"})
        self.staged = {}
        self.commits = dict(commits or {"c1": {"message": "initial", "parent": None,
                                                "tree": dict(self.files)}})
        self.branches = dict(branches or {"main": "c1"})
        self.head = head
        self.counter = len(self.commits)

    def status(self) -> str:
        """Show the branch, staged files and files changed since the last commit."""
        tree = self.commits[self.branches[self.head]]["tree"]
        changed = sorted(p for p in set(self.files) | set(tree) if self.files.get(p) != tree.get(p))
        return (f"on branch {self.head}; staged: {', '.join(sorted(self.staged)) or 'nothing'}; "
                f"changed: {', '.join(changed) or 'nothing'}")

    def log(self) -> str:
        """List the commits of the current branch, newest first."""
        out, cid = [], self.branches[self.head]
        while cid:
            out.append(f"{cid} {self.commits[cid]['message']}")
            cid = self.commits[cid]["parent"]
        return "\n".join(out)

    def write(self, path: str, content: str) -> str:
        """Create or overwrite a file in the working tree.

        Args:
            path: File path, e.g. 'docs/intro.md'.
            content: Full new content.
        """
        if not path or path.startswith("/"):
            raise ValueError("path must be relative and not empty")
        self.files[path] = content
        return f"wrote {path}"

    def remove(self, path: str) -> str:
        """Delete a file from the working tree.

        Args:
            path: File path.
        """
        if path not in self.files:
            raise KeyError(f"no file {path!r}")
        del self.files[path]
        return f"removed {path}"

    def add(self, path: str) -> str:
        """Stage a file's current content (or its deletion) for the next commit.

        Args:
            path: File path.
        """
        tree = self.commits[self.branches[self.head]]["tree"]
        if self.files.get(path) == tree.get(path):
            raise ValueError(f"{path} has no changes to stage")
        self.staged[path] = self.files.get(path)
        return f"staged {path}"

    def commit(self, message: str) -> str:
        """Commit the staged changes on the current branch.

        Args:
            message: Commit message.
        """
        if not self.staged:
            raise ValueError("nothing staged; use add first")
        if not message.strip():
            raise ValueError("commit message must not be empty")
        tree = dict(self.commits[self.branches[self.head]]["tree"])
        for p, c in self.staged.items():
            if c is None:
                tree.pop(p, None)
            else:
                tree[p] = c
        self.counter += 1
        cid = f"c{self.counter}"
        self.commits[cid] = {"message": message, "parent": self.branches[self.head], "tree": tree}
        self.branches[self.head] = cid
        self.staged = {}
        return f"committed {cid}"

    def create_branch(self, name: str) -> str:
        """Create a branch at the current commit (does not switch to it).

        Args:
            name: Branch name.
        """
        if name in self.branches:
            raise ValueError(f"branch {name!r} exists")
        self.branches[name] = self.branches[self.head]
        return f"created branch {name}"

    def switch(self, branch: str) -> str:
        """Switch to a branch; the working tree must have no uncommitted changes.

        Args:
            branch: Branch name.
        """
        if branch not in self.branches:
            raise KeyError(f"no branch {branch!r}")
        if branch == self.head:
            raise ValueError(f"already on {branch}")
        if self.files != self.commits[self.branches[self.head]]["tree"] or self.staged:
            raise ValueError("commit or discard your changes before switching")
        self.head = branch
        self.files = dict(self.commits[self.branches[branch]]["tree"])
        return f"switched to {branch}"
