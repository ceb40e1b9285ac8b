"""``python -m quanta ...``: the ``quanta`` command (quanta.cli.main), for environments
where the console script is not on PATH."""

import sys

from quanta.cli.main import main

sys.exit(main())
