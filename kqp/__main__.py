import sys

from kqp.cli import main

sys.exit(main())
