"""``python -m amp_inspect``: the same as the ``amp-inspect`` command."""

from .cli import main

raise SystemExit(main())
