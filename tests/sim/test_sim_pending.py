"""The simulator counts what the live router counts for the `pending` scorer: a request is
pending on its endpoint from the routing decision to its first token (a P/D prefill leg to
its answer), so between the two the router sees it in flight but no longer pending, and
nothing is left pending when the run ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvfleet_operator.api import load_pool
from kvfleet_sim.fleet import FleetSim, SimSettings, engine_config
from kvfleet_sim.replica import SimReplica
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

REPO = Path(__file__).resolve().parents[2]


def test_a_replica_reports_each_first_token_in_the_step_that_made_it():
    pool = load_pool(REPO / "examples" / "local-sim.yaml")
    r = SimReplica("r0", engine_config(pool), "h100-llama3-8b", 0.0, 0.0)
    r.add("a", list(range(1, 301)), 5, arrival=0.0)
    t, seen = 0.0, []
    while r.engine.has_unfinished_requests():
        t, _ = r.step(t)
        seen.append(list(r.first_tokens))
    assert seen[0] == ["a"] and all(s == [] for s in seen[1:]) and len(seen) == 5


@pytest.mark.parametrize("pool_file", ["examples/local-sim.yaml",
                                       "sim/pools/h100-llama3-8b-pd.yaml"])
def test_the_fleet_counts_pending_from_routing_to_the_first_token(pool_file, monkeypatch):
    pool = load_pool(REPO / pool_file)
    trace = [TraceRequest(i * 0.05, 2000, 60) for i in range(80)]
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec), SimSettings(startup_s=1.0))
    seen: list[tuple[int, int]] = []
    scrape = FleetSim.scrape

    def counting(self: FleetSim, t: float) -> None:
        scrape(self, t)
        eps = self.router.endpoints.values()
        seen.append((sum(e.num_in_flight for e in eps), sum(e.num_pending for e in eps)))

    monkeypatch.setattr(FleetSim, "scrape", counting)
    result = sim.run(trace)
    assert len(result.finished) == len(trace)
    assert any(pending > 0 for _, pending in seen)
    assert any(in_flight > pending for in_flight, pending in seen)  # answering, not pending
    assert all(0 <= pending <= in_flight for in_flight, pending in seen)
    assert all(e.num_pending == 0 == e.num_in_flight for e in sim.router.endpoints.values())
