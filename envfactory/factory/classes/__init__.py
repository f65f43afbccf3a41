"""Imported classes' state: any picklable object graph as a world (``pystate``), copy-on-write
forks (``cow``), and comparing two worlds as their owners would (``compare``)."""
