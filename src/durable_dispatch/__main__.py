"""``python -m durable_dispatch`` runs the ``durable-dispatch`` command."""

from .cli import main

raise SystemExit(main())
