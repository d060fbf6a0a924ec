"""``python -m bench.soak``: run one soak (see :mod:`bench.soak`)."""

import sys

from bench.soak.cli import main

sys.exit(main())
