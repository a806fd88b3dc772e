"""The control loop, written once over small ports; every runtime implements the ports.

- `ports`: what the loop needs from a runtime (replicas, router control, metrics, state
  store, events) as protocols.
- `events`: the `Event` type and its named reasons.
- `state`: `LoopState`, the loop's memory that must survive a restart.
- `observe`: pure rules between what the ports report and the reconcile core.
- `control_loop`: `ControlLoop.tick()`, the one loop (`kvfleet up` and `kvfleet sim` run it).
"""
