"""Plain Python classes, written with no knowledge of envfactory.

Each keeps its state in instance attributes and exposes operations as methods.
``environments/class_envs.py`` turns them, unchanged, into environments with
:func:`envfactory.factory.from_class`.
"""
