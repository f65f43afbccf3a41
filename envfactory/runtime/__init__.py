"""Runtimes: where an environment's episodes execute, behind one interface.

``local`` runs in-process (:class:`LocalEnv`); ``docker`` serves the same
environment code from a hardened container. Both implement
:class:`envfactory.env.Environment`.
"""

from .local import LocalEnv

__all__ = ["LocalEnv"]
