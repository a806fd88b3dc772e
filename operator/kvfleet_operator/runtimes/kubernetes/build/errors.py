"""A valid spec that the Kubernetes runtime cannot run (e.g. a `file://` model source)."""

from __future__ import annotations

from kvfleet_operator.api.errors import UnservableSpecError


class UnservableSpec(UnservableSpecError):
    """Raised by a builder; `path` names the field. A `SpecError`, so the caller reports it
    as `Degraded` with reason `InvalidSpec` (`reconcile.invalid_spec_status`)."""
