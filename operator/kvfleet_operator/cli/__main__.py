"""`python -m kvfleet_operator.cli` runs the `kvfleet` console script."""

from kvfleet_operator.cli.main import main

raise SystemExit(main())
