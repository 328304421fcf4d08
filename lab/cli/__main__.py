"""``python -m lab.cli``: the ``adaptive`` command."""

import sys

from lab.cli import main

sys.exit(main())
