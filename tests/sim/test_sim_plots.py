"""PNG plots: `kvfleet sim compare --plot-dir`, the efficiency plot, the load series."""

import json
from pathlib import Path

import pytest
from kvfleet_operator.cli import main as cli
from kvfleet_sim.efficiency import Point
from kvfleet_sim.fleet import SimSettings
from kvfleet_sim.plots import arrivals_per_second, plot_efficiency
from kvfleet_sim.run import Variant, run_variants

POOL = str(Path(__file__).resolve().parents[2] / "examples" / "local-sim.yaml")
ROWS = [
    {"timestamp": i * 250, "input_length": 700 + 37 * (i % 5), "output_length": 12,
     "hash_ids": [0, 1 + i % 7] + ([100 + i % 7] if i % 3 else [])}
    for i in range(160)
]  # 40 s, seven interleaved "conversations" sharing block 0 (as in test_sim_cli)


@pytest.fixture
def mooncake_trace(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def sim_args(trace):
    return ["--trace", trace, "--start-s", "0", "--warmup-s", "0", "--duration-s", "40",
            "--compress", "2"]  # fmt: skip


def test_compare_plot_dir_writes_every_plot(mooncake_trace, tmp_path, capsys):
    out = tmp_path / "plots"
    rc = cli.main(["sim", "compare", *sim_args(mooncake_trace), "--pool", POOL,
                   "--policy", "cache-aware", "--policy", "round-robin", "--scaler", "kvfleet",
                   "--scaler", "kpa", "--plot-dir", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["hit_rate.png", "latency_cdf.png", "replicas.png"]
    for path in out.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert f"wrote {out / 'replicas.png'}" in capsys.readouterr().out


def test_load_series_counts_the_measured_arrivals(mooncake_trace):
    runs, _, _ = run_variants(mooncake_trace, [Variant(POOL, "fixed-max")], start_s=0.0,
                              duration_s=40.0, warmup_s=0.0, compress=2.0,
                              settings=SimSettings())  # fmt: skip
    xs, load = arrivals_per_second(runs[0], bin_s=2.0)
    assert len(xs) == 10 and xs[1] == 2.0  # 20 virtual seconds in 2 s bins
    assert sum(v * 2.0 for v in load) == len(ROWS)
    assert all(v == 8.0 for v in load)  # one arrival every 0.125 virtual s


def test_efficiency_plot(tmp_path):
    points = [Point(n, n * e, n * e * 1.04, 3.0 * n * e, 1.0, e, []) for n, e in
              ((1, 1.0), (2, 0.97), (4, 0.9), (8, 0.85))]  # fmt: skip
    path = tmp_path / "eff.png"
    plot_efficiency(path, points, "test")
    assert path.stat().st_size > 10_000
