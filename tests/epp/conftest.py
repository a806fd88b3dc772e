"""pytest fixtures for the Endpoint Picker tests; helpers live in epp_fixtures.py."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for extra in (HERE.parent, HERE.parent / "router"):  # tests/helpers, the router's fixtures
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from router_fixtures import procs  # noqa: E402,F401  (re-exported fixture)
