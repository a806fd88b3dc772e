"""pytest fixtures for router tests; helpers live in router_fixtures.py (imported by name)."""

from router_fixtures import procs  # noqa: F401  (re-exported fixture)
