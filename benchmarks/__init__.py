"""envfactory's benchmarks: the ``envfactory bench`` sections (announced in the ``envfactory.bench``
entry-point group, see pyproject.toml) and the longer stand-alone scripts. Nothing here ships inside
the library: every figure is measured against a baseline taken in the same run."""
