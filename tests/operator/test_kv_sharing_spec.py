"""routing.kvSharing: parsed off by default, pushed to the router for builtin engines,
rendered as LMCache for vLLM only where a runtime provides the server, refused with
Degraded/InvalidSpec where it cannot work, and a one-line warning from `kvfleet up`."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

import pytest
import yaml
from kvfleet_operator.api import SpecError, parse_pool
from kvfleet_operator.api.status import ConditionType, PoolStatus, Reason
from kvfleet_operator.decide.engine_args import engine_args, engine_env
from kvfleet_operator.decide.reconcile import invalid_spec_status
from kvfleet_operator.decide.router_config import RouterEndpoint, build_router_config
from kvfleet_operator.runtimes.local.spec_support import unhonoured_fields
from kvfleet_router.config import RouterConfig

WALL = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
EXAMPLES = Path(__file__).parents[2] / "examples"
EPS = [RouterEndpoint("p-0", "http://10.0.0.1:8000", "unified"),
       RouterEndpoint("p-1", "http://10.0.0.2:8000", "unified", is_draining=True)]


def manifest(name, **routing):
    data = yaml.safe_load((EXAMPLES / name).read_text())
    data["spec"].setdefault("routing", {}).update(routing)
    return data


def builtin(**kv):
    return parse_pool(manifest("local-cpu.yaml", prefixMode="precise",
                               kvSharing={"enabled": True, **kv}))


def vllm(**engine):
    data = manifest("vllm-unified.yaml", kvSharing={"enabled": True})
    data["spec"]["engine"].update({"image": "lmcache/vllm-openai:v0.3.11", **engine})
    return parse_pool(data)


def test_off_by_default():
    pool = parse_pool(manifest("local-cpu.yaml"))
    assert pool.spec.routing.kv_sharing.enabled is False
    assert pool.spec.routing.kv_sharing.margin == 1.5
    config = build_router_config(pool.spec, EPS, 1)
    assert "kv_sharing" not in config and all("engine" not in e for e in config["endpoints"])


def test_builtin_pools_push_the_switch_and_margin_to_the_router():
    config = build_router_config(builtin(margin=2.5).spec, EPS, 3)
    assert config["kv_sharing"] == {"enabled": True, "margin": 2.5}
    assert [e["engine"] for e in config["endpoints"]] == ["builtin", "builtin"]
    assert [e["state"] for e in config["endpoints"]] == ["active", "draining"]  # still a peer
    cfg = RouterConfig.from_dict(config)
    assert cfg.kv_sharing.enabled and cfg.kv_sharing.margin == 2.5
    assert {e.prefix_mode for e in cfg.endpoints} == {"precise"}


def test_vllm_pools_share_through_lmcache_not_the_router():
    pool = vllm()
    assert "kv_sharing" not in build_router_config(pool.spec, EPS, 1)
    plain = engine_args(pool.spec, "unified")
    assert "--kv-transfer-config" not in plain  # no server (kvfleet up): no connector
    assert "LMCACHE_REMOTE_URL" not in engine_env(pool.spec, "unified")
    url = "lm://p-lmcache.ns.svc:65432"
    args = engine_args(pool.spec, "unified", lmcache_url=url)
    assert args[-1] == "--disable-uvicorn-access-log"  # user args stay last
    assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector"] == \
        "LMCacheConnectorV1"
    assert engine_env(pool.spec, "unified", lmcache_url=url)["LMCACHE_REMOTE_URL"] == url
    # builtin engines never get LMCache's flags, even with a URL
    assert "--kv-transfer-config" not in engine_args(builtin().spec, "unified", lmcache_url=url)


def test_kvfleet_up_warns_in_one_line_for_vllm_only():
    [line] = [w for w in unhonoured_fields(vllm().spec) if "kvSharing" in w]
    assert "no LMCache server" in line and "\n" not in line
    assert not [w for w in unhonoured_fields(builtin().spec) if "kvSharing" in w]


@pytest.mark.parametrize("change,error", [
    (lambda d: d["spec"]["routing"].pop("prefixMode"), "needs routing.prefixMode: precise"),
    (lambda d: d["spec"]["engine"].update(enablePrefixCaching=False),
     "needs engine.enablePrefixCaching: true"),
    (lambda d: d["spec"]["routing"]["kvSharing"].update(margin=0.9),
     r"margin: must be a finite number in \[1, 100\], got 0.9"),
])
def test_bad_specs_are_degraded_with_a_reason(change, error):
    data = manifest("local-cpu.yaml", prefixMode="precise", kvSharing={"enabled": True})
    bad = copy.deepcopy(data)
    change(bad)
    with pytest.raises(SpecError, match=error) as info:
        parse_pool(bad)
    assert info.value.path.startswith("spec.routing.kvSharing")
    status = invalid_spec_status(PoolStatus(), info.value, WALL)
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded.reason == Reason.INVALID_SPEC and "kvSharing" in degraded.message


def test_vllm_needs_an_lmcache_image_and_a_unified_topology():
    data = manifest("vllm-unified.yaml", kvSharing={"enabled": True})
    data["spec"]["engine"].pop("image")
    with pytest.raises(SpecError, match="needs engine.image"):
        parse_pool(data)
    data = manifest("vllm-disaggregated.yaml", kvSharing={"enabled": True})
    data["spec"]["engine"]["image"] = "lmcache/vllm-openai:v0.3.11"
    with pytest.raises(SpecError, match="needs a unified topology"):
        parse_pool(data)
