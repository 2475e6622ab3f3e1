"""python -m specdec: the same as the `specdec` command."""

import sys

from .cli import main

sys.exit(main())
