"""checkov finds zero failed checks (with test_chart_checkov's pool skips) on the children
of a vLLM pool with routing.kvSharing: its LMCache server Deployment, Service and
NetworkPolicy beside the usual engine and router children."""

from __future__ import annotations

import yaml
from chart_render import ROOT
from test_chart_checkov import POOL_SKIPS, _checkov, _failed  # skips when checkov is absent


def test_the_lmcache_children_have_zero_failed_checks(tmp_path):
    from kvfleet_operator.api import parse_pool
    from kvfleet_operator.runtimes.kubernetes import Tokens, build_children

    data = yaml.safe_load((ROOT / "examples" / "vllm-unified.yaml").read_text())
    data["spec"]["engine"]["image"] = "lmcache/vllm-openai:v0.3.11"
    data["spec"]["routing"]["kvSharing"] = {"enabled": True}
    pool = parse_pool(data)
    pool.uid = "6f1c7a52-0d3e-4d1c-9a57-2b8c1e0f4a11"
    objs = build_children(pool, tokens=Tokens(admin="a" * 16, engine="e" * 16))
    assert any(o["metadata"]["name"].endswith("-lmcache") for o in objs)
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump_all(objs, sort_keys=False))
    result = _checkov(tmp_path, POOL_SKIPS)
    assert _failed(result) == {}
    summary = result["summary"]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0
    assert summary["passed"] > 50 and summary["resource_count"] >= 10
