"""The bench toolkit's shape: every module imports, entry scripts find it without path
hacks, nothing in bench/ reaches into tests/, and its one percentile is the simulator's."""

from __future__ import annotations

import ast
import importlib
import math
import pkgutil
import re
from pathlib import Path

import kvfleet_bench
import pytest
from kvfleet_bench import stats

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
TESTS = REPO / "tests"


def bench_sources() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if not any(
        part.startswith(".") for part in p.relative_to(BENCH).parts))


def test_every_toolkit_module_imports():
    names = [m.name for m in pkgutil.walk_packages(kvfleet_bench.__path__, "kvfleet_bench.")]
    assert {"kvfleet_bench.procs", "kvfleet_bench.stats", "kvfleet_bench.fake_backend",
            "kvfleet_bench.loadgen", "kvfleet_bench.kmock_shim"} <= set(names)
    for name in names:
        importlib.import_module(name)


def test_no_sys_path_edits_in_bench():
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in bench_sources()
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "sys.path" in line]
    assert offenders == []


def test_nothing_in_bench_imports_from_tests():
    # what a test folder on sys.path would make importable: its modules, and tests/helpers
    test_modules = {p.stem for p in TESTS.rglob("*.py")} - {"conftest", "__init__"}
    test_modules |= {"helpers", "tests"}
    offenders = []
    for path in bench_sources():
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names
                          if n.split(".")[0] in test_modules]
        if re.search(r"""/\s*["']tests["']""", source):  # a Path join into tests/
            offenders.append(f"{path.relative_to(REPO)}: a path into tests/")
    assert offenders == []


def test_only_entry_scripts_sit_flat_in_bench():
    for path in BENCH.glob("*.py"):
        tree = ast.parse(path.read_text())
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "main" in defs, f"{path.name} is not an entry script (no main)"
        assert "__main__" in path.read_text(), path.name


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 50, math.nan), ([3.0], 0, 3.0), ([3.0], 100, 3.0), ([1, 2, 3, 4], 50, 2),
    ([1, 2, 3, 4], 51, 3), ([4, 1, 3, 2], 99, 4), ([5, 1], 0, 1), (range(1, 101), 90, 90),
])
def test_percentile_is_nearest_rank_as_the_simulator_reports(values, q, expected):
    from kvfleet_sim.report import percentile as sim_percentile

    got, sim = stats.percentile(values, q), sim_percentile(list(values), q)
    if math.isnan(expected):
        assert math.isnan(got) and math.isnan(sim)
    else:
        assert got == sim == expected
    assert stats.percentile([], q, empty=0.0) == 0.0


def test_median_and_spread_leave_nan_out():
    assert stats.median([1.0, math.nan, 3.0]) == 2.0
    assert math.isnan(stats.median([math.nan]))
    assert stats.spread([3.0, math.nan, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert all(math.isnan(v) for v in stats.spread([]).values())
