"""Reusable tool libraries that environments compose.

Each library defines a pydantic model for its part of the world and tools that
reach it through one attribute of the environment's state (``state.fs``,
``state.desk``, ``state.bank``...), so an environment composes several
libraries by giving its state one field per library.
"""
