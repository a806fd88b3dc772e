"""Start an engine, and a router in front of engines, with the corpus's limits (simulated
runner: deterministic tokens, no model weights). Imported by name (not from conftest)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers

from corpus import ADMIN_TOKEN, BODY_TIMEOUT_S, ENGINE_TOKEN, MAX_BODY, MAX_UPLOADS  # noqa: E402
from helpers.procs import ProcessGroup, ServerProcess, kvfleet_argv  # noqa: E402

ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ENGINE_ARGS = ("--model", "tiny-random", "--runner", "simulated", "--profile", "h100-llama3-8b",
               "--max-body-bytes", str(MAX_BODY), "--body-read-timeout", str(BODY_TIMEOUT_S),
               "--max-uploads-per-client", str(MAX_UPLOADS))


def start_engine(procs: ProcessGroup, token: str = ENGINE_TOKEN) -> ServerProcess:
    return procs.start(kvfleet_argv("engine", "--host", "127.0.0.1", "--port", "{port}",
                                    *ENGINE_ARGS),
                       env={**ENV, "KVFLEET_ENGINE_TOKEN": token}, timeout_s=120)


def start_router(procs: ProcessGroup, tmp: Path, engines: list[ServerProcess]) -> ServerProcess:
    cfg = {"version": 1,
           "endpoints": [{"name": f"e{i}", "url": e.url} for i, e in enumerate(engines)],
           "policy": {"name": "round-robin"},  # every engine sees its share of the barrage
           "health": {"eject_after_errors": 2, "probe_interval_s": 0.5},
           "limits": {"max_body_bytes": MAX_BODY, "body_read_timeout_s": BODY_TIMEOUT_S,
                      "max_uploads_per_client": MAX_UPLOADS}}
    (tmp / "router.json").write_text(json.dumps(cfg))
    (tmp / "admin-token").write_text(ADMIN_TOKEN)
    return procs.start(kvfleet_argv("router", "--config", str(tmp / "router.json"),
                                    "--host", "127.0.0.1", "--port", "{port}",
                                    "--admin-token-file", str(tmp / "admin-token")),
                       env=ENV, timeout_s=60)
