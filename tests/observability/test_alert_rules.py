"""The alerting rules, checked and unit-tested by Debian's promtool (skipped without it;
`.ci/run` installs it)."""

import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "observability" / "prometheus"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="Debian's promtool is not installed")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_rules_check():
    out = _promtool("check", "rules", "kvfleet-alerts.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 10 rules found" in out.stdout


def test_rules_unit_tests_pass():
    out = _promtool("test", "rules", "kvfleet-alerts.test.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_unit_test():
    import yaml

    alerts = {r["alert"] for g in yaml.safe_load((RULES / "kvfleet-alerts.yaml").read_text())
              ["groups"] for r in g["rules"]}  # fmt: skip
    tested = {t["alertname"] for case in yaml.safe_load(
        (RULES / "kvfleet-alerts.test.yaml").read_text())["tests"]
        for t in case["alert_rule_test"] if t.get("exp_alerts")}  # fmt: skip
    assert alerts == tested
