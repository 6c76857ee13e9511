"""``python -m amp_inspect``: the same as the ``amp-inspect`` command."""

from amp_inspect.cli.commands import main

raise SystemExit(main())
