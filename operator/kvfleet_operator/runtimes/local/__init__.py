"""The local runtime (`kvfleet up`): the loop's ports over processes on 127.0.0.1.

- `replicas`: the `ReplicaRuntime` port (engine processes, restarts with `backoff`).
- `procs`: child processes that die with their parent.
- `spec`: what a local fleet can honour of a pool spec.
- `store`, `state_dir`, `registry`: `state.json`, the state folder, running fleets.
- `progress`: the terminal's live progress lines.
"""
