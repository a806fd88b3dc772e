"""One hash function for every router process of a pool.

The approximate prefix index hashes prompt bytes with Python's `hash` (prefix_index.py):
C speed, but seeded per process (PYTHONHASHSEED), so two router processes disagree on every
block hash and could not share what they recorded (exchange.py). Processes that share the
admin token (a pool's router replicas and a pod's workers) derive one seed from it: a secret
seed, so clients still cannot craft colliding prompts, yet the same in every replica.

`ensure_hash_seed(token, argv)` re-executes `kvfleet router <argv>` once with that seed in
the environment when it differs (a fresh interpreter running `kvfleet_router.cli.main`, so
it is right however `main` was reached); everything else stays as it was.
`fingerprint()` is a value of this process's hash of bytes that peers compare before
trusting each other's block hashes.
"""

from __future__ import annotations

import hashlib
import os
import sys

SEED_ENV = "PYTHONHASHSEED"
GROUP_ENV = "KVFLEET_ROUTER_GROUP"  # one value per pod, set by the workers' supervisor
_PROBE = b"kvfleet exchange fingerprint"


def hash_seed_for(token: str) -> str:
    """PYTHONHASHSEED's value for a pool with this admin token: 1..4294967295 (0 would
    switch randomization off)."""
    digest = hashlib.sha256(b"kvfleet-hash-seed\0" + token.encode()).digest()
    return str(int.from_bytes(digest[:4], "big") % 4294967295 + 1)


def fingerprint() -> int:
    """This process's hash of a fixed byte string: equal in two processes iff they hash bytes
    alike (same seed), so their prefix indexes' block hashes are comparable."""
    return hash(_PROBE)


RUN_ROUTER = "import sys; from kvfleet_router.cli import main; sys.exit(main(sys.argv[1:]))"


def ensure_hash_seed(token: str | None, argv: list[str]) -> None:
    """Re-execute this process with the pool's seed unless it already runs with it. Without a
    token there is no exchange (it is authenticated), so nothing to agree on."""
    if not token:
        return
    seed = hash_seed_for(token)
    if os.environ.get(SEED_ENV) == seed:
        return
    env = dict(os.environ, **{SEED_ENV: seed})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-c", RUN_ROUTER, *argv], env)
