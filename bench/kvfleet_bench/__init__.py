"""kvfleet's benchmark toolkit: what the entry scripts in `bench/` share.

The entry scripts (`bench/*.py`) run as `python bench/<name>.py`, so this package is on
their path without help; the editable install (`bench` is one of pyproject's package
roots) makes it importable from the tests too.
"""
