"""`kvfleet sim`: a tiny run end to end, and one-line errors for bad input."""

import json
from pathlib import Path

import pytest
from kvfleet_operator.cli import main as cli

POOL = str(Path(__file__).resolve().parents[2] / "examples" / "local-sim.yaml")


@pytest.fixture
def small_trace(tmp_path):
    rows = [f"2023-11-16 18:00:{s // 4:02d}.{(s % 4) * 25:02d}00000,300,20\n" for s in range(120)]
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    return str(path)


def test_small_run_writes_table_json_and_plot(small_trace, tmp_path, capsys):
    # folders that do not exist yet are made (a run may take minutes before it writes)
    out_json, out_png = tmp_path / "new" / "r.json", tmp_path / "new" / "plots" / "r.png"
    rc = cli.main(["sim", "--trace", small_trace, "--pool", POOL, "--start-s", "5",
                   "--duration-s", "20", "--warmup-s", "5", "--json", str(out_json),
                   "--plot", str(out_png), "--scaler", "kvfleet", "--scaler", "fixed-max"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| kvfleet |" in out and "| fixed-max |" in out and "waiting-5" not in out
    data = json.loads(out_json.read_text())
    assert [r["summary"]["name"] for r in data["runs"]] == ["kvfleet", "fixed-max"]
    assert all(r["summary"]["num_requests"] == 80 for r in data["runs"])
    assert out_png.stat().st_size > 1000


def test_misses_every_shows_where_a_run_missed_its_slo(small_trace, tmp_path, capsys):
    """Every request misses a 1 ms TTFT target: each 5 s window is listed, its arrivals
    all TTFT misses; a 60 s target leaves no window to list. The JSON has every window."""
    out_json = tmp_path / "r.json"
    args = ["sim", "run", "--trace", small_trace, "--pool", POOL, "--start-s", "5",
            "--duration-s", "20", "--warmup-s", "5", "--compress", "1", "--scaler",
            "fixed-max", "--misses-every", "5", "--no-progress"]
    assert cli.main([*args, "--ttft-slo", "0.001", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "fixed-max: SLO misses by 5 s window from the end of warm-up (4 of 4 windows)" in out
    run = json.loads(out_json.read_text())["runs"][0]
    windows = run["miss_windows"]
    assert [w["start_s"] for w in windows] == [0.0, 5.0, 10.0, 15.0]
    assert sum(w["num_arrivals"] for w in windows) == run["summary"]["num_requests"] > 0
    assert all(w["num_ttft_missed"] == w["num_arrivals"] > 0 for w in windows)
    assert "| 0-5 | " in out and "| 15-20 | " in out
    assert cli.main([*args, "--ttft-slo", "60", "--itl-slo", "60"]) == 0
    out = capsys.readouterr().out
    assert "(0 of 4 windows)" in out and "| window (s) |" not in out
    # the table has medians over the seeds; the windows are the first seed's, and say so
    seeded = ["compare", *args[2:], "--seeds", "2", "--seed", "3", "--ttft-slo", "0.001"]
    assert cli.main(["sim", *seeded]) == 0
    assert "fixed-max (seed 3): SLO misses by 5 s window" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,match",
    [
        (["--trace", "/nonexistent.csv", "--pool", POOL], "cannot read"),
        (["--pool", POOL], "--trace"),
        (["--trace", "X", "--pool", "/nonexistent.yaml", "--warmup-s", "0"], "cannot read"),
        (["--trace", "X", "--pool", POOL, "--scaler", "magic"], "invalid choice"),
        (["--trace", "X", "--pool", POOL, "--warmup-s", "50", "--start-s", "10"], "warmup"),
    ],
)
def test_bad_input_is_one_line(args, match, capsys, small_trace):
    args = [small_trace if a == "X" else a for a in args]
    assert cli.main(["sim", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


# --- run / compare, Mooncake, reproducibility ---

MOONCAKE_ROWS = [
    {"timestamp": i * 250, "input_length": 700 + 37 * (i % 5), "output_length": 12,
     "hash_ids": [0, 1 + i % 7] + ([100 + i % 7] if i % 3 else [])}
    for i in range(160)
]  # 40 s, seven interleaved "conversations" sharing block 0 and their own second block


@pytest.fixture
def mooncake_trace(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS))
    return str(path)


def sim_args(trace, *extra):
    return ["--trace", trace, "--start-s", "0", "--warmup-s", "0", "--duration-s", "40",
            "--compress", "2", *extra]


def test_run_one_configuration(mooncake_trace, tmp_path, capsys):
    out_json = tmp_path / "run.json"
    rc = cli.main(["sim", "run", *sim_args(mooncake_trace), "--pool", POOL,
                   "--policy", "round-robin", "--json", str(out_json)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(out_json.read_text())
    (run,) = data["runs"]
    assert run["variant"] == {"pool_path": POOL, "scaler": "kvfleet", "policy": "round-robin"}
    s = run["summary"]
    assert s["num_requests"] == 160 and s["num_failed"] == 0
    assert 0 < s["prefix_hit_rate"] < 1 and s["e2e_p50_s"] >= s["ttft_p50_s"]
    assert run["imbalance"] and all(v >= 0 for _, v in run["imbalance"])


def test_compare_policies_one_table(mooncake_trace, capsys):
    rc = cli.main(["sim", "compare", *sim_args(mooncake_trace), "--pool", POOL,
                   "--policy", "cache-aware", "--policy", "round-robin",
                   "--policy", "sgl-cache-aware", "--scaler", "fixed-max"])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "| cache-aware |" in out and "| round-robin |" in out and "| sgl-cache-aware |" in out
    assert "prefix hit" in out and "E2E p50" in out and "imbalance" in out


def test_seeds_give_each_column_its_median_over_the_seeds_and_the_spread(
        mooncake_trace, tmp_path, capsys):
    common = ["sim", "compare", *sim_args(mooncake_trace), "--pool", POOL, "--policy",
              "random", "--scaler", "fixed-max"]
    path = tmp_path / "seeds.json"
    assert cli.main([*common, "--seed", "3", "--seeds", "3", "--json", str(path)]) == 0
    table = capsys.readouterr().out
    data = json.loads(path.read_text())
    by_seed = [rs[0] for rs in data["summaries_by_seed"]]
    # each entry is that seed's own run: the second is what --seed 4 alone gives
    one = tmp_path / "one.json"
    assert cli.main([*common, "--seed", "4", "--json", str(one)]) == 0
    capsys.readouterr()
    assert by_seed[1] == json.loads(one.read_text())["runs"][0]["summary"]
    assert data["runs"][0]["summary"] == by_seed[0]  # "runs" is the first seed's, whole
    (median,) = data["medians"]
    assert median["num_seeds"] == 3
    for key in ("slo_attainment", "max_share", "ttft_p90_s", "e2e_p50_s"):
        column = sorted(s[key] for s in by_seed)
        assert median[key] == column[1], key
    shares = [s["max_share"] for s in by_seed]
    assert len(set(shares)) > 1  # the seeds did differ, so the spread below is real
    assert median["spread"]["max_share"] == [min(shares), max(shares)]
    row = table.splitlines()[2]  # the one run's row
    assert f"{median['max_share']:.2f} ({min(shares):.2f}-{max(shares):.2f})" in row


@pytest.fixture
def bursty_trace(tmp_path):
    """A minute of 10-s bursts (12 req/s) and lulls (2 req/s): enough to move the local
    pool's autoscaler."""
    rows = []
    for second in range(60):
        n = 12 if (second // 10) % 2 == 0 else 2
        for k in range(n):
            t = second + k / n
            rows.append(f"2023-11-16 18:00:{t:010.7f},{1500 + 300 * (k % 4)},60\n")
    path = tmp_path / "bursts.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    return str(path)


def test_seeds_give_replica_seconds_their_spread_where_the_scaler_moved(
        bursty_trace, tmp_path, capsys):
    """Under the autoscaler the router's seed moves scale decisions, so replica-s gets its
    min-max; a fleet fixed at its size spends the same at every seed and shows it bare."""
    path = tmp_path / "seeds.json"
    assert cli.main(["sim", "compare", "--trace", bursty_trace, "--start-s", "0",
                     "--warmup-s", "0", "--duration-s", "60", "--compress", "1", "--pool", POOL,
                     "--policy", "random", "--scaler", "kvfleet", "--scaler", "fixed-max",
                     "--seeds", "3",
                     "--json", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    data = json.loads(path.read_text())
    for i, (median, row) in enumerate(zip(data["medians"], table[2:4], strict=True)):
        spent = [rs[i]["replica_seconds"] for rs in data["summaries_by_seed"]]
        assert median["spread"]["replica_seconds"] == [min(spent), max(spent)]
        cells = [c.strip() for c in row.split("|")]
        want = f"{median['replica_seconds']:.0f}"
        if min(spent) != max(spent):
            want += f" ({min(spent):.0f}-{max(spent):.0f})"
        assert cells[8] == want, (row, spent)
    kvfleet_spent = [rs[0]["replica_seconds"] for rs in data["summaries_by_seed"]]
    assert len(set(kvfleet_spent)) > 1  # the seeds did move the autoscaler: a real spread
    assert "(" not in table[3].split("|")[8]  # fixed-max: the same at every seed


@pytest.mark.parametrize("extra, match", [
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--seeds", "2", "--optimum"], "reactive scalers only"),
    (["--seeds", "2", "--scaler", "oracle"], "reactive scalers only"),
])
def test_seeds_refuse_what_they_cannot_do(extra, match, mooncake_trace, capsys):
    assert cli.main(["sim", "compare", *sim_args(mooncake_trace), "--pool", POOL,
                     *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def run_in_process(args, seed):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    return subprocess.run([sys.executable, "-m", "kvfleet_sim.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_results_are_bit_for_bit_reproducible_across_processes(mooncake_trace, tmp_path):
    """Same seed, two processes with different string-hash seeds: identical JSON."""
    outs = []
    for i, hash_seed in enumerate((1, 2)):
        path = tmp_path / f"r{i}.json"
        done = run_in_process(["compare", *sim_args(mooncake_trace), "--pool", POOL,
                               "--policy", "cache-aware", "--policy", "random",
                               "--scaler", "fixed-max", "--scaler", "kvfleet",
                               "--prefix-mode", "precise",
                               "--seed", "7", "--json", str(path)], hash_seed)
        assert done.returncode == 0, done.stderr
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]
    data = json.loads(outs[0])
    assert all(r["summary"]["num_requests"] == 160 for r in data["runs"])


@pytest.mark.parametrize(
    "args,match",
    [
        (["run", "--pool", POOL, "--rate", "0"], "rate"),
        (["run", "--pool", POOL, "--rate", "nan"], "rate"),
        (["run", "--pool", POOL, "--rate", "-1"], "rate"),
        (["run", "--pool", POOL, "--rate", "inf"], "rate"),
        (["run", "--pool", POOL, "--trace", "DIR"], "cannot read"),
        (["run", "--pool", "INVALID"], "spec."),
        (["run", "--pool", POOL, "--compress", "0"], "compress"),
        (["run", "--pool", POOL, "--policy", "magic"], "invalid choice"),
        (["run", "--pool", "LOCAL_CPU"], "simulated"),
        (["compare", "--pool", POOL, "--pool", "LOCAL_CPU"], "simulated"),
        (["run", "--pool", POOL, "--trace", "BAD"], "malformed"),
        (["run", "--pool", POOL, "--json", "FILE/out.json"], "cannot create its folder"),
        (["run", "--pool", POOL, "--plot", "FILE/x/out.png"], "cannot create its folder"),
        (["compare", "--pool", POOL, "--pinned", "0"], "must be in 1..1000, got 0"),
        (["run", "--pool", POOL, "--misses-every", "0"], "--misses-every must be > 0, got 0"),
        (["compare", "--pool", POOL, "--pinned", "two"], "not an integer: 'two'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, match, mooncake_trace, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    local_cpu = str(Path(POOL).parent / "local-cpu.yaml")
    full = [*args[:1], *sim_args(mooncake_trace), *args[1:]]
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("apiVersion: kvfleet.io/v1alpha1\nkind: InferencePool\n"
                       "metadata: {name: x}\nspec: {model: {name: m}}\n")  # fmt: skip
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    named = {"BAD": str(bad), "LOCAL_CPU": local_cpu, "DIR": str(tmp_path),
             "INVALID": str(invalid)}  # fmt: skip
    full = [named.get(a, a).replace("FILE", str(a_file)) for a in full]
    assert cli.main(["sim", *full]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


# --- gate ---


@pytest.fixture
def small_pool(tmp_path):
    import yaml

    m = yaml.safe_load(Path(POOL).read_text())
    m["spec"]["topology"]["unified"]["replicas"] = {"min": 1, "max": 1}
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(m))
    return str(path)


def test_gate_passes_an_equal_candidate_and_fails_a_worse_one(small_trace, small_pool, capsys):
    base = ["--trace", small_trace, "--start-s", "5", "--duration-s", "20", "--warmup-s", "5",
            "--compress", "4", "--rate", "10", "--scaler", "fixed-max", "--baseline", POOL]
    assert cli.main(["sim", "gate", *base, "--candidate", POOL]) == 0
    assert "gate: candidate is no worse" in capsys.readouterr().out
    # One replica instead of six at 40x the rate: cheaper, but the SLO is missed.
    assert cli.main(["sim", "gate", *base, "--candidate", small_pool]) == 1
    out = capsys.readouterr().out
    assert "| baseline: " in out and "| candidate: " in out and "SLO attainment" in out
    # The other way round the candidate costs more replica-seconds.
    swapped = [a if a != POOL else small_pool for a in base]
    assert cli.main(["sim", "gate", *swapped, "--candidate", POOL]) == 1
    assert "replica-seconds" in capsys.readouterr().out.splitlines()[-1]
    assert cli.main(["sim", "gate", *swapped, "--candidate", POOL,
                     "--cost-tolerance", "10"]) == 0
    assert cli.main(["sim", "gate", *base, "--candidate", POOL, "--slo-tolerance", "-1"]) == 2
