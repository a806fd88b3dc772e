"""The walls of docs/architecture.md hold (import-linter's contracts in pyproject.toml),
and the check bites: each break below, made in a copy of the packages, fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = {
    "kvfleet_engine": "engine", "kvfleet_router": "router",
    "kvfleet_operator": "operator", "kvfleet_sim": "sim",
}

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def lint(cwd: Path, pythonpath: list[Path] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_contracts_hold_on_this_checkout():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.fixture(scope="module")
def copy_of_packages(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("walls")
    for package, folder in PACKAGES.items():
        shutil.copytree(ROOT / folder / package, tmp / folder / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "csrc"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


BREAKS = [
    ("kvfleet_engine/core/scheduler.py", "import kvfleet_router.config",
     "The engine imports none of the other packages"),
    ("kvfleet_engine/core/block_pool.py", "import torch", "neither torch nor aiohttp"),
    ("kvfleet_router/proxy.py", "import kvfleet_engine.server.metrics",
     "The router imports only the engine's contract"),
    ("kvfleet_router/pd_plan.py", "import aiohttp", "P/D plan and routing core do no I/O"),
    ("kvfleet_router/router_core.py", "import kvfleet_router.metrics",
     "P/D plan and routing core do no I/O"),
    ("kvfleet_operator/api/status.py", "import kvfleet_router.proxy",
     "the router's config schema and the engine's contract only"),
    ("kvfleet_router/perf_model.py", "import kvfleet_router.config",
     "needs only the standard library"),
    ("kvfleet_router/revision_stats.py", "import aiohttp", "The per-revision counters"),
    ("kvfleet_operator/decide/slo_sizing.py", "import kvfleet_router.policies.scorers",
     "the router's config schema and the engine's contract only"),
    ("kvfleet_operator/decide/autoscaler.py", "import kvfleet_operator.loop.ports",
     "The operator's rooms point one way"),
    ("kvfleet_operator/decide/reconcile.py", "import aiohttp", "decisions do no I/O"),
]


@pytest.mark.parametrize(("module", "line", "contract"), BREAKS,
                         ids=[b[2].split()[-1] + ":" + b[0] for b in BREAKS])
def test_a_forbidden_import_breaks_its_contract(copy_of_packages, module, line, contract):
    tmp = copy_of_packages
    folder = PACKAGES[module.split("/", 1)[0]]
    path = tmp / folder / module
    original = path.read_text()
    path.write_text(original + f"\n{line}  # a deliberate break\n")
    try:
        out = lint(tmp, [tmp / f for f in PACKAGES.values()])
    finally:
        path.write_text(original)
    assert out.returncode != 0, out.stdout
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, out.stdout
