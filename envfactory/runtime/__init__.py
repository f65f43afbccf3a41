"""Runtimes: where an episode's world lives, behind one interface.

The referee (:class:`envfactory.episode.Episode`) always runs in this process;
the world it drives is a :class:`envfactory.world.World`: ``local``
(:class:`~envfactory.world.LocalWorld`, in-process) or ``docker``
(:class:`envfactory.runtime.docker.ContainerWorld`, a hardened container).
Pick one with ``envfactory.make(name, runtime=...)``. Nothing is imported here:
the Docker runtime's dependencies load only when it is used.
"""
