"""``python -m polygrad ...`` is the ``polygrad`` command."""
from polygrad.apps.cli import main

raise SystemExit(main())
