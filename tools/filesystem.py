"""A file system: directories and text files, addressed by absolute paths.

Tools reach it as ``state.fs``.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from typing import Any

from pydantic import BaseModel, Field

from envfactory import ToolError, tool

__all__ = ["FileTree", "TOOLS"] 


class FileTree(BaseModel):
    """Directories (a set of paths) and files (path -> text)."""

    dirs: set[str] = Field(default_factory=lambda: {"/"})
    files: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def build(cls, files: dict[str, str], dirs: tuple[str, ...] = ()) -> "FileTree":
        """A tree holding ``files`` and every parent directory they need."""
        tree = cls(dirs={"/"}, files={})
        for d in dirs:
            tree._mkdirs(d)
        for path, content in files.items():
            tree._mkdirs(posixpath.dirname(path))
            tree.files[path] = content
        return tree

    def _mkdirs(self, path: str) -> None:
        while path not in self.dirs:
            self.dirs.add(path)
            path = posixpath.dirname(path)


MAX_PATH = 4096
MAX_PATTERN = 1024
"""A file-name glob longer than this is refused: ``fnmatch`` translates a pattern in time that grows
with its length times its unclosed ``[`` (200,000 characters took 81 s of one core)."""


def _norm(path: str) -> str:
    if not path.startswith("/"):
        raise ToolError(f"path {path!r} must be absolute (start with '/')")
    if len(path) > MAX_PATH:  # make_dir creates every parent: a long path grows the state quadratically
        raise ToolError(f"path is too long ({len(path)} characters; at most {MAX_PATH})")
    norm = posixpath.normpath(path)
    # normpath keeps exactly two leading slashes (POSIX leaves '//' implementation-defined);
    # here they are one root, else dirname('//x') is '//' and make_dir never reaches '/'
    return "/" + norm.lstrip("/")


def _fs(state: Any) -> FileTree:
    return state.fs


def _require_dir(fs: FileTree, path: str) -> None:
    if path not in fs.dirs:
        if path in fs.files:
            raise ToolError(f"{path} is a file, not a directory")
        raise ToolError(f"directory {path} does not exist")


def _require_file(fs: FileTree, path: str) -> None:
    if path not in fs.files:
        if path in fs.dirs:
            raise ToolError(f"{path} is a directory, not a file")
        raise ToolError(f"file {path} does not exist")


@tool(read_only=True)
def list_dir(state: Any, path: str) -> str:
    """List the entries of a directory (directories end with '/').

    Args:
        path: Absolute path of the directory.
    """
    fs = _fs(state)
    path = _norm(path)
    _require_dir(fs, path)
    prefix = path.rstrip("/") + "/"
    entries = set()
    for p in fs.dirs:
        if p != path and p.startswith(prefix) and "/" not in p[len(prefix):]:
            entries.add(p[len(prefix):] + "/")
    for p in fs.files:
        if p.startswith(prefix) and "/" not in p[len(prefix):]:
            entries.add(p[len(prefix):])
    return "\n".join(sorted(entries)) if entries else "(empty directory)"


@tool(read_only=True)
def read_file(state: Any, path: str) -> str:
    """Return the full text of a file.

    Args:
        path: Absolute path of the file.
    """
    fs = _fs(state)
    path = _norm(path)
    _require_file(fs, path)
    return fs.files[path]


@tool
def write_file(state: Any, path: str, content: str) -> str:
    """Create a file or replace its content. The parent directory must exist.

    Args:
        path: Absolute path of the file.
        content: The complete new text of the file.
    """
    fs = _fs(state)
    path = _norm(path)
    if path in fs.dirs:
        raise ToolError(f"{path} is a directory")
    _require_dir(fs, posixpath.dirname(path))
    fs.files[path] = content
    return f"Wrote {len(content)} characters to {path}."


@tool
def append_file(state: Any, path: str, content: str) -> str:
    """Append text to the end of an existing file.

    Args:
        path: Absolute path of the file.
        content: Text to append (include a leading newline if you want one).
    """
    fs = _fs(state)
    path = _norm(path)
    _require_file(fs, path)
    fs.files[path] += content
    return f"Appended {len(content)} characters to {path}."


@tool
def delete_file(state: Any, path: str) -> str:
    """Delete a file.

    Args:
        path: Absolute path of the file.
    """
    fs = _fs(state)
    path = _norm(path)
    _require_file(fs, path)
    del fs.files[path]
    return f"Deleted {path}."


@tool
def make_dir(state: Any, path: str) -> str:
    """Create a directory, with any missing parents.

    Args:
        path: Absolute path of the directory.
    """
    fs = _fs(state)
    path = _norm(path)
    probe = path
    while probe != "/":
        if probe in fs.files:
            raise ToolError(f"{probe} is a file")
        probe = posixpath.dirname(probe)
    if path in fs.dirs:
        return f"{path} already exists."
    fs._mkdirs(path)
    return f"Created {path}."


def _destination(fs: FileTree, src: str, dst: str) -> str:
    if dst in fs.dirs:
        dst = posixpath.join(dst, posixpath.basename(src))
    _require_dir(fs, posixpath.dirname(dst))
    if dst in fs.files:
        raise ToolError(f"{dst} already exists; delete it first")
    if dst in fs.dirs:
        raise ToolError(f"{dst} is a directory")
    return dst


@tool
def move_file(state: Any, source: str, destination: str) -> str:
    """Move or rename a file. If the destination is a directory, the file keeps its name.

    Args:
        source: Absolute path of the file to move.
        destination: New absolute path, or an existing directory.
    """
    fs = _fs(state)
    src, dst = _norm(source), _norm(destination)
    _require_file(fs, src)
    dst = _destination(fs, src, dst)
    fs.files[dst] = fs.files.pop(src)
    return f"Moved {src} to {dst}."


@tool
def copy_file(state: Any, source: str, destination: str) -> str:
    """Copy a file. If the destination is a directory, the copy keeps the file's name.

    Args:
        source: Absolute path of the file to copy.
        destination: Absolute path of the copy, or an existing directory.
    """
    fs = _fs(state)
    src, dst = _norm(source), _norm(destination)
    _require_file(fs, src)
    dst = _destination(fs, src, dst)
    fs.files[dst] = fs.files[src]
    return f"Copied {src} to {dst}."


@tool(read_only=True)
def find_files(state: Any, directory: str, pattern: str) -> str:
    """Find files under a directory (recursively) whose name matches a glob pattern.

    Args:
        directory: Absolute path to search under.
        pattern: Glob pattern for the file name, e.g. '*.txt'.
    """
    if len(pattern) > MAX_PATTERN:
        raise ToolError(f"pattern is too long ({len(pattern)} characters; at most {MAX_PATTERN})")
    fs = _fs(state)
    directory = _norm(directory)
    _require_dir(fs, directory)
    prefix = directory.rstrip("/") + "/"
    # compiled here, not by fnmatch.fnmatch: its cache keeps 32,768 compiled patterns (about 3 KB each
    # for an agent's made-up ones), which grew a shared container's server by up to 100 MB (issue 63)
    match = re.compile(fnmatch.translate(pattern)).match
    hits = sorted(p for p in fs.files if p.startswith(prefix) and match(posixpath.basename(p)))
    return "\n".join(hits) if hits else "No matching files."


@tool(read_only=True)
def search_text(state: Any, directory: str, text: str) -> str:
    """Find lines containing a text (case-sensitive) in files under a directory.

    Args:
        directory: Absolute path to search under.
        text: The text to look for.
    """
    fs = _fs(state)
    directory = _norm(directory)
    _require_dir(fs, directory)
    if not text:
        raise ToolError("text must not be empty")
    prefix = directory.rstrip("/") + "/"
    hits = []
    for p in sorted(fs.files):
        if p.startswith(prefix):
            for n, line in enumerate(fs.files[p].splitlines(), 1):
                if text in line:
                    hits.append(f"{p}:{n}: {line}")
    return "\n".join(hits) if hits else "No matches."


TOOLS = [list_dir, read_file, write_file, append_file, delete_file, make_dir, move_file, copy_file,
         find_files, search_text]
