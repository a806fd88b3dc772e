"""The args kvfleet renders are valid for the vLLM that runs them: every example and role
parses with vLLM's own parser, the committed flag list is the installed vLLM's, and the
rendered unified args start a server that answers /health and a completion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvfleet_operator.api import vllm_compat as vc
from kvfleet_operator.api.errors import UnservableSpecError
from kvfleet_operator.api.pool import load_pool
from kvfleet_operator.decide import engine_args as ea
from vllm_helpers import ROOT, post_json, run_vllm_script

EXAMPLES = sorted((ROOT / "examples").glob("vllm-*.yaml"))


def test_committed_flag_list_is_the_installed_vllms():
    installed = json.loads(run_vllm_script())
    committed = json.loads((ROOT / "operator/kvfleet_operator/api/vllm_flags.json").read_text())
    assert installed["version"] == committed["version"] == vc.VLLM_VERSION
    assert installed["flags"] == committed["flags"], (
        "regenerate: bench/.venv-vllm/bin/python tests/vllm/extract_vllm_flags.py "
        "> operator/kvfleet_operator/api/vllm_flags.json")


def test_every_example_and_role_parses_with_vllms_parser(figures, monkeypatch):
    cases: list[tuple[str, str, bool, list[str]]] = []
    for path in EXAMPLES:
        pool = load_pool(path)
        for role in pool.spec.topology.roles():
            for precise in (False, True):
                monkeypatch.setattr(ea, "is_precise_routing", lambda spec, p=precise: p)
                cases.append((path.name, role, precise, ea.engine_args(pool.spec, role)))
    # A control: vLLM's parser really rejects what kvfleet used to render.
    cases.append(("control", "unified", False, ["--model", "m", "--disable-log-requests"]))
    results = json.loads(run_vllm_script("--parse", json.dumps([c[3] for c in cases])))
    for (name, role, precise, args), result in zip(cases[:-1], results[:-1], strict=True):
        assert result["ok"], f"{name} {role} precise={precise}: {result['error']}\n{args}"
        if precise:
            assert "enable_kv_cache_events=True" in result["kv_events_config"]
    assert not results[-1]["ok"] and "--disable-log-requests" in results[-1]["error"]
    figures["parsed_arg_sets"] = len(cases) - 1


def test_cpu_target_rejects_the_examples_block_size():
    pool = load_pool(ROOT / "examples" / "vllm-unified.yaml")
    with pytest.raises(UnservableSpecError, match="multiple of 32"):
        vc.check_vllm_engine(pool.spec.engine, device="cpu")


def test_rendered_args_start_vllm_and_serve_a_completion(vllm_server, figures):
    import openai

    assert vllm_server.args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    client = openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused")
    out = client.completions.create(model=vllm_server.model, prompt="The capital of France is",
                                    max_tokens=8, temperature=0)
    assert out.choices[0].text and out.usage.completion_tokens > 0
    chat = post_json(vllm_server.url + "/v1/chat/completions", {
        "model": vllm_server.model, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Say hi."}]})
    assert chat["choices"][0]["message"]["content"] is not None
    figures["startup_s"] = round(vllm_server.startup_s, 1)
    figures["served_args"] = [a if not a.startswith("/") else Path(a).name
                              for a in vllm_server.args]


def test_live_vllm_metrics_read_honestly(vllm_server):
    """vLLM's real /metrics through kvfleet's reader: its series are read, the kvfleet-only
    backlog gauge is unknown (None), and the backlog is derived from vLLM's series."""
    from kvfleet_operator.decide.role_signals import (
        BACKLOG_DERIVED,
        Scrape,
        ScrapeLog,
        aggregate,
        parse_metrics,
    )
    from vllm_helpers import http_get

    post_json(vllm_server.url + "/v1/completions", {
        "model": vllm_server.model, "prompt": "Hello " * 40, "max_tokens": 2})
    sample = parse_metrics(http_get(vllm_server.url + "/metrics").decode())
    assert sample.num_waiting_prompt_tokens is None
    assert sample.num_prompt_tokens > 0 and sample.num_requests > 0 and sample.ttft
    log = ScrapeLog()
    log.add("v0", Scrape(0.0, sample))
    rs = aggregate(log, {"v0": "unified"}, now=0.0, window_s=30, stale_after_s=30)
    assert rs.roles["unified"].backlog_from == BACKLOG_DERIVED
