"""``python -m actors.cli``: the ``fractor`` command, without its console script."""

from . import main

raise SystemExit(main())
