"""``python -m kernelhub.cli``: the ``kernelhub`` command."""

import sys

from kernelhub.cli import main

sys.exit(main())
