"""`python -m pyspec.cli`: the `pyspec` command."""

import sys

from .main import main

sys.exit(main())
