"""A records archive: a tree of folders and documents with a current folder (a third-party style API).

Unchanged by envfactory: it loads its scenario after construction, keeps a pointer
into its own tree (``_cwd``) and knows nothing about agents.
"""

from typing import Dict, List, Optional, Union


class Document:
    def __init__(self, title: str, body: str = "", tags: Optional[List[str]] = None) -> None:
        self.title = title
        self.body = body
        self.tags = set(tags or ())

    def __repr__(self) -> str:
        return f"<Document: {self.title}>"


class Folder:
    def __init__(self, name: str, parent: Optional["Folder"] = None) -> None:
        self.name = name
        self.parent = parent
        self.items: Dict[str, Union[Document, "Folder"]] = {}

    def __repr__(self) -> str:
        return f"<Folder: {self.name}>"


class RecordsArchive:
    """A records archive with folders, documents and tags, browsed from a current folder."""

    def __init__(self) -> None:
        self.root: Folder
        self._cwd: Folder

    def _load_scenario(self, scenario: dict) -> None:
        self.root = self._build("archive", scenario.get("folders", {}), None)
        self._cwd = self.root

    def _build(self, name: str, tree: dict, parent: Optional[Folder]) -> Folder:
        folder = Folder(name, parent)
        for key, node in tree.items():
            if isinstance(node, dict) and node.get("kind") == "doc":
                folder.items[key] = Document(key, node.get("body", ""), node.get("tags"))
            else:
                folder.items[key] = self._build(key, node, folder)
        return folder

    def _where(self, folder: Folder) -> str:
        parts = []
        while folder.parent is not None:
            parts.append(folder.name)
            folder = folder.parent
        return "/" + "/".join(reversed(parts))

    def _resolve(self, path: str) -> Union[Folder, Document]:
        node: Union[Folder, Document] = self.root if path.startswith("/") else self._cwd
        for part in [p for p in path.split("/") if p and p != "."]:
            if part == "..":
                if not isinstance(node, Folder) or node.parent is None:
                    raise FileNotFoundError(f"no such path: {path}")
                node = node.parent
                continue
            if not isinstance(node, Folder) or part not in node.items:
                raise FileNotFoundError(f"no such path: {path}")
            node = node.items[part]
        return node

    def _doc(self, path: str) -> Document:
        node = self._resolve(path)
        if not isinstance(node, Document):
            raise IsADirectoryError(f"{path} is a folder, not a document")
        return node

    def current_folder(self) -> Dict[str, str]:
        """The folder you are in."""
        return {"folder": self._where(self._cwd)}

    def list_items(self, path: str = ".") -> Dict[str, List[str]]:
        """List a folder: its sub-folders (ending in '/') and documents.

        Args:
            path: A folder path, absolute ('/finance') or relative to the current folder.
        """
        node = self._resolve(path)
        if not isinstance(node, Folder):
            raise NotADirectoryError(f"{path} is a document")
        return {"items": sorted(k + "/" if isinstance(v, Folder) else k for k, v in node.items.items())}

    def open_folder(self, path: str) -> Dict[str, str]:
        """Make a folder the current folder ('..' goes up).

        Args:
            path: The folder path.
        """
        node = self._resolve(path)
        if not isinstance(node, Folder):
            raise NotADirectoryError(f"{path} is a document")
        self._cwd = node
        return {"folder": self._where(node)}

    def read_document(self, path: str) -> Dict[str, object]:
        """A document's text and tags.

        Args:
            path: The document path ('/hr/policy' or 'policy' in the current folder).
        """
        doc = self._doc(path)
        return {"title": doc.title, "body": doc.body, "tags": sorted(doc.tags)}

    def find_tagged(self, tag: str) -> Dict[str, List[str]]:
        """Every document carrying a tag, by path.

        Args:
            tag: The tag.
        """
        found: List[str] = []

        def walk(folder: Folder, prefix: str) -> None:
            for name, node in sorted(folder.items.items()):
                if isinstance(node, Folder):
                    walk(node, f"{prefix}/{name}")
                elif tag in node.tags:
                    found.append(f"{prefix}/{name}")

        walk(self.root, "")
        return {"documents": found}

    def tag_document(self, path: str, tag: str) -> str:
        """Add a tag to a document.

        Args:
            path: The document path.
            tag: The tag to add.
        """
        doc = self._doc(path)
        if tag in doc.tags:
            raise ValueError(f"{doc.title} is already tagged {tag}")
        doc.tags.add(tag)
        return f"tagged {doc.title} as {tag}"

    def untag_document(self, path: str, tag: str) -> str:
        """Remove a tag from a document.

        Args:
            path: The document path.
            tag: The tag to remove.
        """
        doc = self._doc(path)
        if tag not in doc.tags:
            raise ValueError(f"{doc.title} is not tagged {tag}")
        doc.tags.discard(tag)
        return f"removed tag {tag} from {doc.title}"

    def move_document(self, path: str, folder: str) -> str:
        """Move a document into another folder.

        Args:
            path: The document path.
            folder: The destination folder path.
        """
        doc = self._doc(path)
        dest = self._resolve(folder)
        if not isinstance(dest, Folder):
            raise NotADirectoryError(f"{folder} is a document")
        if doc.title in dest.items:
            raise FileExistsError(f"{self._where(dest)} already holds {doc.title}")
        source = self._resolve(path.rsplit("/", 1)[0] or "/") if "/" in path else self._cwd
        del source.items[doc.title]
        dest.items[doc.title] = doc
        return f"moved {doc.title} to {self._where(dest)}"
