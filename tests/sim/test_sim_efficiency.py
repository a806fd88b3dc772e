"""Scaling efficiency: the bisection on the rate multiplier, and a tiny N = 1, 2 run."""

import json
import math
from pathlib import Path

import pytest
from kvfleet_operator.cli import main as cli
from kvfleet_sim.efficiency import MIN_RATE, NoRateError, check_replicas, max_rate, measure
from kvfleet_sim.fleet import SimSettings
from kvfleet_sim.trace import MAX_RATE

POOL = str(Path(__file__).resolve().parents[2] / "examples" / "local-sim.yaml")


def step(boundary, calls=None):
    """An SLO attainment that is 1 up to `boundary` and 0 above it."""

    def probe(rate):
        if calls is not None:
            calls.append(rate)
        return 1.0 if rate <= boundary else 0.0

    return probe


@pytest.mark.parametrize("guess", [1.0, 3.0, 20.0, 3.7])
def test_bisection_ends_within_tolerance_of_the_boundary(guess):
    found = max_rate(step(3.7), guess, threshold=0.99, tol=0.05)
    # Not the bracket's start (2 or 2.5 here): the boundary to within 5%.
    assert 3.7 / 1.05 < found.rate <= 3.7 < found.upper <= found.rate * 1.05
    assert found.probes[0][0] == guess and len(found.probes) <= 8
    assert all((att == 1.0) == (r <= 3.7) for r, att in found.probes)


def test_a_good_guess_needs_few_probes():
    calls = []
    found = max_rate(step(7.5, calls), 8.0, threshold=0.99, tol=0.05)
    assert calls[:2] == [8.0, 4.0] and len(calls) == 6  # bracket [4, 8], then 4 halvings
    assert found.rate > 7.5 / 1.05


def test_caps_at_max_rate_and_fails_below_min_rate():
    found = max_rate(lambda r: 1.0, 1.0, threshold=0.99)
    assert found.rate == MAX_RATE and found.upper is None
    with pytest.raises(NoRateError):
        max_rate(lambda r: 0.0, 1.0, threshold=0.99)
    with pytest.raises(NoRateError):
        max_rate(lambda r: math.nan, 1.0, threshold=0.99)  # no requests is no pass
    with pytest.raises(ValueError):
        max_rate(step(2), MIN_RATE / 2, threshold=0.99)


def test_replica_lists():
    assert check_replicas([8, 2, 4]) == [1, 2, 4, 8]
    for bad in ([], [2, 2], [0, 1], [1, 2000]):
        with pytest.raises(ValueError):
            check_replicas(bad)


@pytest.fixture
def small_trace(tmp_path):
    # 12 s of 1500-token prompts, 4 per second; one replica holds a few times this rate.
    rows = [f"2023-11-16 18:00:{s // 4:02d}.{(s % 4) * 25:02d}00000,1500,100\n" for s in range(48)]
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    return str(path)


def test_one_and_two_replicas_sane_and_reproducible(small_trace, tmp_path, capsys):
    args = dict(start_s=2.0, duration_s=10.0, warmup_s=2.0, compress=1.0,
                settings=SimSettings(seed=3), slo_attainment=0.99, tol=0.1)  # fmt: skip
    points, ttft, itl = measure(small_trace, POOL, [2], **args)
    one, two = points
    assert (one.replicas, two.replicas) == (1, 2) and (ttft, itl) == (1.0, 0.05)
    assert one.efficiency == 1.0 and 0.5 < two.efficiency < 1.3
    for p in points:
        # The figure passed, the next probe up failed, and they are within the tolerance.
        assert p.slo_attainment >= 0.99 and p.upper_rate is not None
        assert p.max_rate < p.upper_rate <= p.max_rate * 1.1
        assert dict(p.probes)[p.upper_rate] < 0.99
        assert p.req_per_s > 0
    assert two.probes[0][0] == 2 * one.max_rate  # the first guess: perfect scaling
    # The CLI, in the same process: the same figures, a table, JSON and a plot.
    out_json, out_png = tmp_path / "e.json", tmp_path / "e.png"
    rc = cli.main(["sim", "efficiency", "--trace", small_trace, "--pool", POOL,
                   "--start-s", "2", "--duration-s", "10", "--warmup-s", "2", "--compress", "1",
                   "--seed", "3", "--tolerance", "0.1", "--replicas", "1,2",
                   "--json", str(out_json), "--plot", str(out_png)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "| replicas | max rate multiplier | req/s |" in out and "| 2 |" in out
    data = json.loads(out_json.read_text())
    assert data["points"] == json.loads(json.dumps([p.to_dict() for p in points]))
    assert out_png.stat().st_size > 5000


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--replicas", "1,x"], "integers"),
        (["--replicas", "0,2"], "1..1000"),
        (["--replicas", "2,2"], "distinct"),
        (["--replicas", ""], "integers"),
        (["--slo-attainment", "1.5"], "slo-attainment"),
        (["--slo-attainment", "nan"], "slo-attainment"),
        (["--tolerance", "0"], "tolerance"),
        (["--rate", "0"], "rate"),
        (["--rate", "-2"], "rate"),
        (["--rate", "nan"], "rate"),
        (["--pool", "LOCAL_CPU"], "simulated"),
        (["--trace", "BAD"], "malformed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra, match, small_trace, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    local_cpu = str(Path(POOL).parent / "local-cpu.yaml")
    args = ["efficiency", "--trace", small_trace, "--pool", POOL, "--start-s", "2",
            "--duration-s", "10", "--warmup-s", "2", "--compress", "1", *extra]  # fmt: skip
    args = [str(bad) if a == "BAD" else local_cpu if a == "LOCAL_CPU" else a for a in args]
    assert cli.main(["sim", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def fake_runs(capacity_per_replica):
    """A stand-in for run_variants: N replicas meet the SLO up to N x capacity."""
    from types import SimpleNamespace

    calls = []

    def run_variants(trace, variants, *args):
        rate = args[7]  # (start, duration, warmup, compress, settings, ttft, itl, rate)
        calls.append((variants[0].replicas, rate))
        ok = rate <= variants[0].replicas * capacity_per_replica
        summary = SimpleNamespace(slo_attainment=1.0 if ok else 0.5, num_requests=10,
                                  duration_s=5.0)  # fmt: skip
        return [SimpleNamespace(summary=summary)], 1.0, 0.05

    return run_variants, calls


def test_linear_capacity_gives_full_efficiency_from_few_probes(monkeypatch):
    import kvfleet_sim.efficiency as eff

    fake, calls = fake_runs(2.5)
    monkeypatch.setattr(eff, "run_variants", fake)
    points, _, _ = eff.measure("t", "p", [4, 16], 0, 10, 0, 1, SimSettings(), tol=0.05)
    assert [p.replicas for p in points] == [1, 4, 16]
    assert all(0.95 < p.efficiency <= 1.0 for p in points)
    first_4 = next(r for n, r in calls if n == 4)
    assert first_4 == 4 * points[0].max_rate  # bracketed from N x the one-replica figure
    assert all(len(p.probes) <= 7 for p in points)


def test_one_replica_capped_is_an_error(monkeypatch):
    import kvfleet_sim.efficiency as eff

    fake, _ = fake_runs(1e6)
    monkeypatch.setattr(eff, "run_variants", fake)
    with pytest.raises(ValueError, match="nothing to scale against"):
        eff.measure("t", "p", [1, 2], 0, 10, 0, 1, SimSettings())
