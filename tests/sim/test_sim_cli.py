"""`kvfleet sim`: a tiny run end to end, and one-line errors for bad input."""

import json
from pathlib import Path

import pytest
from kvfleet_operator import cli

POOL = str(Path(__file__).resolve().parents[2] / "examples" / "local-sim.yaml")


@pytest.fixture
def small_trace(tmp_path):
    rows = [f"2023-11-16 18:00:{s // 4:02d}.{(s % 4) * 25:02d}00000,300,20\n" for s in range(120)]
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    return str(path)


def test_small_run_writes_table_json_and_plot(small_trace, tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
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
