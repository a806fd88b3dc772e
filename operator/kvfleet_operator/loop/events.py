"""What the control loop and the runtimes report: typed events with named reasons.

An `Event` has what a Kubernetes Event needs (type, reason, message). Local fleets print the
message and keep the last ones in state.json; the simulator counts scale events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

NORMAL, WARNING = "Normal", "Warning"


class EventReason:
    """CamelCase reasons, one per kind of thing that happened."""

    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"
    REPLICA_STARTED = "ReplicaStarted"
    REPLICA_READY = "ReplicaReady"
    REPLICA_DRAINING = "ReplicaDraining"
    REPLICA_UNDRAINED = "ReplicaUndrained"
    REPLICA_STOPPING = "ReplicaStopping"
    DRAIN_TIMED_OUT = "DrainTimedOut"  # stopped at its drain timeout with requests in flight
    REPLICA_STOPPED = "ReplicaStopped"
    REPLICA_CRASHED = "ReplicaCrashed"
    REPLICA_RESTARTED = "ReplicaRestarted"
    ROUTER_VERSION_AHEAD = "RouterVersionAhead"  # routers run a config this loop never saved
    REPLICA_ADOPTED = "ReplicaAdopted"  # a restarted `kvfleet up` took a running one back
    REPLICA_START_TIMEOUT = "ReplicaStartTimeout"
    ROUTER_PUSH_FAILED = "RouterPushFailed"
    LOOP_ERROR = "ControlLoopError"
    STATE_WRITE_FAILED = "StateWriteFailed"
    SPEC_NOT_HONOURED = "SpecNotHonoured"
    ODD_SETTING = "OddSetting"
    # A rollout's events: decide/rollout.py's RolloutReason (RolloutStarted, RollbackSLO, ...)


@dataclass(slots=True, frozen=True)
class Event:
    type: str  # NORMAL or WARNING
    reason: str  # an EventReason
    message: str

    def __post_init__(self) -> None:
        if self.type not in (NORMAL, WARNING):
            raise ValueError(f"event type must be {NORMAL} or {WARNING}, got {self.type!r}")


def normal(reason: str, message: str) -> Event:
    return Event(NORMAL, reason, message)


def warning(reason: str, message: str) -> Event:
    return Event(WARNING, reason, message)


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...


class Fanout:
    """One sink that hands every event to several (the terminal, the metrics, ...)."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks

    def emit(self, event: Event) -> None:
        for sink in self.sinks:
            sink.emit(event)
