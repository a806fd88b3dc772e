"""A valid spec that the Kubernetes runtime cannot run (e.g. a `file://` model source)."""

from __future__ import annotations

from kvfleet_operator.api.errors import SpecError


class UnservableSpec(SpecError):
    """Raised by a builder; `path` names the field. The caller reports it as
    `Degraded` (a `SpecError`, so `reconcile.invalid_spec_status` takes it as is)."""
