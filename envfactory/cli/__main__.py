"""``python -m envfactory.cli``: the ``envfactory`` command."""

import sys

from . import main

sys.exit(main())
