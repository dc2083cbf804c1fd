"""`python -m kqpsim list` and `python -m kqpsim run ROW --seed N [--trace]` (kqpsim.cli)."""

import sys

from kqpsim.cli import main

sys.exit(main())
