"""The one error a bad InferencePool produces: a field path and what is wrong with it."""

from __future__ import annotations


class SpecError(ValueError):
    """An invalid InferencePool; `path` names the field, e.g. `spec.engine.blockSize`."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


class UnservableSpecError(SpecError):
    """A pool the CRD accepts but that can never run: it names something this kvfleet
    release does not have (a builtin model or profile), or settings no scorer can use.
    The apiserver cannot know these; the parser rejects them up front."""


def join_path(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"
