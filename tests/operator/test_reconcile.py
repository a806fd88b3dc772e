"""reconcile: engine flags per engine kind and role, router config, plans and conditions."""

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kvfleet_operator.api import SpecError, load_pool, parse_pool
from kvfleet_operator.api.status import ConditionType, Reason, ScaleDecision
from kvfleet_operator.decide.engine_args import engine_args, engine_command, engine_env, model_ref
from kvfleet_operator.decide.reconcile import (
    Observed,
    ObservedReplica,
    initial_replicas,
    invalid_spec_status,
    reconcile,
)
from kvfleet_router.config import RouterConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WALL = datetime(2026, 1, 1, tzinfo=UTC)


def pool(topology=None, engine=None, model=None, routing=None, autoscaling=None, status=None):
    manifest = {
        "apiVersion": "kvfleet.io/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {
            "model": model
            or {"name": "meta-llama/Llama-3.1-8B", "source": "hf://meta-llama/Llama-3.1-8B"},
            "engine": engine or {"kind": "vllm"},
            "topology": topology or {"unified": {"replicas": {"min": 1, "max": 4}}},
        },
    }
    if routing:
        manifest["spec"]["routing"] = routing
    if autoscaling:
        manifest["spec"]["autoscaling"] = autoscaling
    if status:
        manifest["status"] = status
    return parse_pool(manifest)


PD = {
    "prefill": {"replicas": {"min": 1, "max": 4}},
    "decode": {"replicas": {"min": 2, "max": 16}, "gpus": 2},
}
NIXL = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize(
    "topology,role,expected,absent",
    [
        (
            None,
            "unified",
            {
                "--model": "meta-llama/Llama-3.1-8B",
                "--port": "8000",
                "--served-model-name": "meta-llama/Llama-3.1-8B",
                "--max-num-seqs": "256",
                "--max-num-batched-tokens": "8192",
                "--block-size": "16",
            },
            ["--kv-transfer-config", "--tensor-parallel-size"],
        ),
        (PD, "prefill", {"--kv-transfer-config": NIXL}, ["--tensor-parallel-size"]),
        (PD, "decode", {"--kv-transfer-config": NIXL, "--tensor-parallel-size": "2"}, []),
    ],
)
def test_vllm_flags_per_role(topology, role, expected, absent):
    p = pool(topology=topology)
    args = engine_args(p.spec, role)
    for name, value in expected.items():
        assert flag(args, name) == value, name
    for name in absent:
        assert name not in args
    assert "--enable-prefix-caching" in args
    assert json.loads(flag(args, "--kv-transfer-config") or "{}") == (
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"} if role != "unified" else {}
    )
    env = engine_env(p.spec, role)
    assert ("VLLM_NIXL_SIDE_CHANNEL_PORT" in env) == (role != "unified")
    assert engine_command(p.spec)[1:] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_vllm_engine_settings_and_user_args_last():
    p = pool(
        engine={
            "kind": "vllm",
            "maxNumSeqs": 64,
            "maxModelLen": 4096,
            "blockSize": 32,
            "enablePrefixCaching": False,
            "numBlocks": 1000,
            "args": ["--max-num-seqs", "99"],
        },
        model={"name": "m", "source": "pvc://models/llama/8b", "servedModelName": "llama"},
    )
    args = engine_args(p.spec, "unified", port=9000)
    assert flag(args, "--model") == "/models/llama/8b"
    assert flag(args, "--served-model-name") == "llama"
    assert flag(args, "--max-model-len") == "4096"
    assert flag(args, "--block-size") == "32"
    assert flag(args, "--num-gpu-blocks-override") == "1000"
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert flag(args, "--port") == "9000"
    assert args[-2:] == ["--max-num-seqs", "99"]  # user args come last, so they win


@pytest.mark.parametrize(
    "source,expected",
    [
        ("hf://org/repo", "org/repo"),
        ("file:///srv/m.gguf", "/srv/m.gguf"),
        ("pvc://claim", "/models"),
        ("s3://bucket/key", "s3://bucket/key"),
    ],
)
def test_model_ref(source, expected):
    assert model_ref(pool(model={"name": "m", "source": source}).spec) == expected


def test_object_storage_uses_the_streamer():
    p = pool(model={"name": "m", "source": "s3://bucket/llama"})
    assert flag(engine_args(p.spec, "unified"), "--load-format") == "runai_streamer"


@pytest.mark.parametrize(
    "path,role,expected",
    [
        (
            "local-cpu.yaml",
            "unified",
            {
                "--model": "smollm2-135m",
                "--runner": "torch",
                "--role": "unified",
                "--max-num-seqs": "8",
                "--num-blocks": "512",
                "--max-model-len": "2048",
                "--drain-timeout": "30",
                "--served-model-name": "smollm2",
            },
        ),
        (
            "local-sim.yaml",
            "unified",
            {
                "--runner": "simulated",
                "--profile": "h100-llama3-8b",
                "--model": "llama3-8b-sim",
                "--num-blocks": "8192",
            },
        ),
    ],
)
def test_builtin_flags(path, role, expected):
    p = load_pool(EXAMPLES / path)
    args = engine_args(p.spec, role, host="127.0.0.1", port=8123)
    for name, value in expected.items():
        assert flag(args, name) == value, name
    assert flag(args, "--host") == "127.0.0.1" and flag(args, "--port") == "8123"
    assert engine_command(p.spec)[-2:] == ["kvfleet_operator.cli.main", "engine"]


def test_builtin_pd_roles_and_unknown_role():
    p = pool(
        topology=PD,
        engine={"kind": "builtin", "runner": "simulated", "profile": "h100-llama3-8b"},
        model={"name": "m", "source": "builtin://llama3-8b-sim"},
    )
    assert flag(engine_args(p.spec, "prefill"), "--role") == "prefill"
    assert flag(engine_args(p.spec, "decode"), "--role") == "decode"
    with pytest.raises(ValueError, match="unified"):
        engine_args(p.spec, "unified")


def rep(name, role="unified", phase="ready", port=None, **kw):
    url = f"http://127.0.0.1:{port or 9000 + int(name[-1])}"
    return ObservedReplica(name=name, role=role, phase=phase, url=url, **kw)


def test_first_reconcile_starts_min_and_pushes_an_empty_router_config():
    d = reconcile(pool(), Observed(), now=0.0, wall=WALL)
    plan = d.roles["unified"]
    assert (plan.num_desired, plan.num_to_start, plan.to_drain, plan.to_stop) == (1, 1, [], [])
    assert d.router_config["version"] == 1 and d.router_config["endpoints"] == []
    assert d.is_router_config_changed
    assert d.status.condition(ConditionType.READY).reason == Reason.REPLICAS_NOT_READY
    assert d.status.condition(ConditionType.PROGRESSING).reason == Reason.SCALING_UP


@pytest.mark.parametrize(
    "topology,observed,desired,starts,drains,stops,undrains",
    [
        # Unified: 2 ready, want 4 -> start 2.
        (None, [rep("u1"), rep("u2")], {"unified": 4}, {"unified": 2}, [], [], []),
        # Want 1 of 3: drain the two with the fewest in-flight requests.
        (
            None,
            [rep("u1", num_in_flight=5), rep("u2", num_in_flight=0), rep("u3", num_in_flight=1)],
            {"unified": 1},
            {},
            ["u2", "u3"],
            [],
            [],
        ),
        # Not-ready replicas go first and stop at once.
        (None, [rep("u1"), rep("u2", phase="starting")], {"unified": 1}, {}, [], ["u2"], []),
        # A drained replica stops; one still busy waits.
        (
            None,
            [
                rep("u1"),
                rep("u2", phase="draining", drain_started_at=0.0),
                rep("u3", phase="draining", drain_started_at=0.0, num_in_flight=2),
            ],
            {"unified": 1},
            {},
            [],
            ["u2"],
            [],
        ),
        # Drain timeout passed (120 s default): stop even with requests in flight.
        (
            None,
            [rep("u1"), rep("u2", phase="draining", drain_started_at=-500.0, num_in_flight=2)],
            {"unified": 1},
            {},
            [],
            ["u2"],
            [],
        ),
        # Scale up while one drains: put it back to work instead of starting a new one.
        (
            None,
            [rep("u1"), rep("u2", phase="draining", drain_started_at=0.0)],
            {"unified": 3},
            {"unified": 1},
            [],
            [],
            ["u2"],
        ),
        # Failed replicas are being restarted: they count, nothing new starts.
        (
            None,
            [rep("u1"), rep("u2", phase="failed", num_restarts=2)],
            {"unified": 2},
            {},
            [],
            [],
            [],
        ),
        # Prefill/decode: each role on its own; desired clamps to min/max.
        (
            PD,
            [rep("p1", "prefill"), rep("d1", "decode"), rep("d2", "decode")],
            {"prefill": 9, "decode": 1},
            {"prefill": 3},
            [],
            [],
            [],
        ),
    ],
)
def test_plans(topology, observed, desired, starts, drains, stops, undrains):
    d = reconcile(pool(topology=topology), Observed(observed), desired, now=10.0, wall=WALL)
    assert {r: p.num_to_start for r, p in d.roles.items() if p.num_to_start} == starts
    assert sorted(n for p in d.roles.values() for n in p.to_drain) == drains
    assert sorted(n for p in d.roles.values() for n in p.to_stop) == stops
    assert sorted(n for p in d.roles.values() for n in p.to_undrain) == undrains
    # The router sees exactly ready + draining replicas, victims already marked draining.
    cfg = RouterConfig.from_dict(d.router_config)
    states = {e.name: e.state for e in cfg.endpoints}
    for r in observed:
        if r.name in stops or r.phase not in ("ready", "draining"):
            assert r.name not in states
        elif r.name in drains or (r.phase == "draining" and r.name not in undrains):
            assert states[r.name] == "draining"
        else:
            assert states[r.name] == "active"


def test_router_config_round_trips_through_the_router_parser():
    p = pool(
        topology=PD,
        routing={
            "policy": "prefix-cache",
            "weights": {"prefix": 2, "queue": 1},
            "imbalance": {"absThreshold": 10, "relThreshold": 2.0},
            "minPrefixMatch": 0.25,
            "sessionHeader": "x-user",
            "pdThresholdTokens": 256,
        },
    )
    obs = Observed([rep("p1", "prefill"), rep("d1", "decode"), rep("d2", "decode")])
    d = reconcile(p, obs, now=0.0, wall=WALL)
    cfg = RouterConfig.from_dict(d.router_config)
    assert cfg.version == 1
    assert cfg.policy.name == "prefix-cache"
    assert cfg.policy.weights == {**RouterConfig().policy.weights, "prefix": 2.0, "queue": 1.0}
    assert (cfg.policy.imbalance.abs_threshold, cfg.policy.imbalance.rel_threshold) == (10, 2.0)
    assert cfg.policy.min_prefix_match == 0.25
    assert cfg.session.header == "x-user" and cfg.pd.prefill_threshold_tokens == 256
    assert {(e.name, e.role, e.url) for e in cfg.endpoints} == {
        ("p1", "prefill", "http://127.0.0.1:9001"),
        ("d1", "decode", "http://127.0.0.1:9001"),
        ("d2", "decode", "http://127.0.0.1:9002"),
    }
    assert all(e.models == ["meta-llama/Llama-3.1-8B"] and e.capacity == 512 for e in cfg.endpoints)
    assert RouterConfig.from_dict(cfg.to_dict()) == cfg


def test_router_version_moves_only_on_change():
    p = pool()
    obs = Observed([rep("u1")])
    first = reconcile(p, obs, now=0.0, wall=WALL)
    same = reconcile(p, obs, now=1.0, wall=WALL, previous_router_config=first.router_config)
    assert same.router_config["version"] == 1 and not same.is_router_config_changed
    more = Observed([rep("u1"), rep("u2")])
    changed = reconcile(
        p, more, {"unified": 2}, now=2.0, wall=WALL, previous_router_config=same.router_config
    )
    assert changed.router_config["version"] == 2 and changed.is_router_config_changed
    assert changed.status.router_config_version == 2


def test_unset_weights_keep_the_router_defaults():
    d = reconcile(pool(routing={"weights": {"kv": 2}}), Observed([rep("u1")]), now=0.0, wall=WALL)
    defaults = RouterConfig().policy.weights
    assert d.router_config["policy"]["weights"] == {**defaults, "kv": 2.0}
    no_weights = reconcile(pool(), Observed([rep("u1")]), now=0.0, wall=WALL)
    assert "weights" not in no_weights.router_config["policy"]
    assert "prefill_weights" not in no_weights.router_config["policy"]
    assert "pd" not in no_weights.router_config


def test_prefill_weights_reach_the_router_over_its_defaults():
    d = reconcile(pool(routing={"prefillWeights": {"backlog": 8}}), Observed([rep("u1")]),
                  now=0.0, wall=WALL)
    policy = d.router_config["policy"]
    assert policy["prefill_weights"] == {**RouterConfig().policy.prefill_weights, "backlog": 8.0}
    assert "weights" not in policy  # the other legs keep theirs
    assert RouterConfig.from_dict(d.router_config).policy.prefill_weights["backlog"] == 8.0


@pytest.mark.parametrize(
    "observed,desired,kw,expect",
    [
        (
            [rep("u1"), rep("u2")],
            {"unified": 2},
            {},
            {
                ConditionType.READY: ("True", Reason.ALL_REPLICAS_READY),
                ConditionType.PROGRESSING: ("False", Reason.RECONCILED),
                ConditionType.DEGRADED: ("False", Reason.AS_EXPECTED),
                ConditionType.SCALING_LIMITED: ("False", Reason.WITHIN_LIMITS),
            },
        ),
        (
            [rep("u1"), rep("u2", phase="starting")],
            {"unified": 2},
            {},
            {
                ConditionType.READY: ("False", Reason.REPLICAS_NOT_READY),
                ConditionType.PROGRESSING: ("True", Reason.RECONCILING),
            },
        ),
        (
            [rep("u1"), rep("u2")],
            {"unified": 1},
            {},
            {ConditionType.PROGRESSING: ("True", Reason.SCALING_DOWN)},
        ),
        (
            [rep("u1"), rep("u2", phase="failed")],
            {"unified": 2},
            {},
            {ConditionType.DEGRADED: ("True", Reason.REPLICA_FAILED)},
        ),
        (
            [rep("u1")],
            {"unified": 1},
            {"num_unknown_signals": 1},
            {ConditionType.DEGRADED: ("True", Reason.SIGNALS_STALE)},
        ),
        (
            [rep("u1")],
            {"unified": 1},
            {"is_router_ready": False},
            {ConditionType.READY: ("False", Reason.ROUTER_NOT_READY)},
        ),
    ],
)
def test_conditions(observed, desired, kw, expect):
    d = reconcile(pool(), Observed(observed, **kw), desired, now=0.0, wall=WALL)
    for type_, (status, reason) in expect.items():
        c = d.status.condition(type_)
        assert (c.status, c.reason) == (status, reason), (type_, c)


def test_scaling_limited_and_scaled_to_zero_and_decisions():
    p = pool(
        topology={"unified": {"replicas": {"min": 0, "max": 2}}},
        autoscaling={"scaleToZero": {"enabled": True}},
    )
    decision = ScaleDecision(time="t", from_replicas=1, to_replicas=0, reason="idle")
    d = reconcile(
        p,
        Observed([]),
        {"unified": 0},
        now=0.0,
        wall=WALL,
        limited={"unified": Reason.AT_MIN_REPLICAS},
        decisions={"unified": decision},
    )
    assert d.status.condition(ConditionType.READY).reason == Reason.SCALED_TO_ZERO
    lim = d.status.condition(ConditionType.SCALING_LIMITED)
    assert lim.is_true and lim.reason == Reason.AT_MIN_REPLICAS
    assert d.status.roles["unified"].last_scale_decision == decision
    assert d.status.to_dict()["roles"]["unified"]["readyOfDesired"] == "0/0"


def test_transition_time_kept_while_status_holds():
    p = pool()
    first = reconcile(p, Observed([rep("u1")]), now=0.0, wall=WALL)
    p.status = first.status
    later = datetime(2026, 1, 2, tzinfo=UTC)
    again = reconcile(p, Observed([rep("u1")]), now=1.0, wall=later)
    t0 = first.status.condition(ConditionType.READY).last_transition_time
    assert again.status.condition(ConditionType.READY).last_transition_time == t0


def test_initial_replicas_from_status_or_min():
    p = pool(topology=PD)
    assert initial_replicas(p.spec) == {"prefill": 1, "decode": 2}
    p2 = pool(topology=PD, status={"roles": {"decode": {"desiredReplicas": 40}}})
    assert initial_replicas(p2.spec, p2.status) == {"prefill": 1, "decode": 16}


def test_replicas_of_a_removed_role_are_drained_away():
    obs = Observed([rep("u1"), rep("d1", "decode"), rep("d2", "decode", phase="starting")])
    d = reconcile(pool(), obs, {"unified": 1}, now=0.0, wall=WALL)
    assert d.roles["unified"].to_drain == ["d1"] and d.roles["unified"].to_stop == ["d2"]


def test_invalid_spec_status():
    st = invalid_spec_status(pool().status, SpecError("spec.engine.blockSize", "bad"), WALL)
    assert st.condition(ConditionType.DEGRADED).reason == Reason.INVALID_SPEC
    assert "spec.engine.blockSize" in st.condition(ConditionType.READY).message


def test_observed_replica_checks():
    with pytest.raises(ValueError, match="phase"):
        ObservedReplica("x", "unified", "running")
    with pytest.raises(ValueError, match="url"):
        ObservedReplica("x", "unified", "ready")


@pytest.mark.parametrize("path", ["local-cpu.yaml", "local-sim.yaml"])
def test_builtin_flags_parse_with_the_engine_cli(path):
    from kvfleet_engine.cli import build_parser

    p = load_pool(EXAMPLES / path)
    ns = build_parser().parse_args(engine_args(p.spec, "unified", host="127.0.0.1", port=0))
    assert ns.role == "unified" and ns.port == 0
    assert ns.served_model_name == [p.spec.model.api_name]
    assert ns.max_num_seqs == p.spec.engine.max_num_seqs


def test_engine_queue_outlasts_the_router_capacity():
    from kvfleet_operator.decide.router_config import capacity

    p = load_pool(EXAMPLES / "local-cpu.yaml")
    args = engine_args(p.spec, "unified")
    admitted = p.spec.engine.max_num_seqs + int(flag(args, "--max-queue"))
    assert admitted > capacity(p.spec) >= p.spec.engine.max_num_seqs


@pytest.mark.parametrize("targets,expected", [
    ({}, None),
    ({"ttftP90Seconds": 0.5}, {"ttft_s": 0.5}),
    ({"ttftP90Seconds": 1.5, "itlP90Seconds": 0.04}, {"ttft_s": 1.5, "tpot_s": 0.04}),
])
def test_the_pools_latency_targets_are_the_slo_policys(targets, expected):
    p = pool(autoscaling={"targets": targets} if targets else None,
             routing={"policy": "slo"})
    config = reconcile(p, Observed(), now=0.0, wall=WALL).router_config
    assert config["policy"].get("slo") == expected
    parsed = RouterConfig.from_dict(config).policy.slo  # the router takes them as they are
    assert parsed.ttft_s == (expected or {}).get("ttft_s", 2.0)
    assert parsed.tpot_s == (expected or {}).get("tpot_s", 0.05)


def test_the_pools_pipeline_is_the_routers_policy():
    """routing.pipeline reaches the router as its policy: the router builds that pipeline
    (filters, only the scorers set, picker, guard) and routes by it."""
    from kvfleet_router.router_core import RouterCore

    pipeline = {"filters": ["bounded-load"], "scorers": {"kv": 1, "queue": 2},
                "picker": "power-of-two"}
    p = pool(routing={"policy": "pipeline", "pipeline": pipeline})
    config = reconcile(p, Observed([rep("u1"), rep("u2")]), now=0.0, wall=WALL).router_config
    cfg = RouterConfig.from_dict(config)
    assert cfg.policy.name == "pipeline"
    built = RouterCore(cfg).policies["pipeline"].pipeline
    assert (built.filters, built.scorers, built.picker, built.guard) == (
        ["bounded-load"], {"kv": 1.0, "queue": 2.0}, "power-of-two", False)
    assert "pipelines" not in reconcile(pool(), Observed(), now=0.0,
                                        wall=WALL).router_config["policy"]


def test_the_pools_pipeline_roles_reach_the_router():
    """routing.pipeline.roles.prefill is the stage the router runs on prefill legs; a role
    left unset runs the pipeline's own."""
    from kvfleet_router.router_core import RouterCore

    prefill = {"scorers": {"prefix": 1, "queue": 4, "backlog": 4}, "guard": True}
    p = pool(routing={"policy": "pipeline",
                      "pipeline": {"scorers": {"queue": 1}, "roles": {"prefill": prefill}}})
    cfg = RouterConfig.from_dict(reconcile(p, Observed(), now=0.0, wall=WALL).router_config)
    policy = RouterCore(cfg).policies["pipeline"]
    assert set(policy.for_role) == {"prefill"}
    stage = policy.for_role["prefill"].pipeline
    assert (stage.scorers, stage.guard) == ({"prefix": 1.0, "queue": 4.0, "backlog": 4.0}, True)


def test_the_space_weight_reaches_the_router_beside_the_defaults():
    p = pool(routing={"weights": {"space": 0.01}})
    config = reconcile(p, Observed(), now=0.0, wall=WALL).router_config
    weights = RouterConfig.from_dict(config).policy.weights
    assert weights["space"] == 0.01 and weights["prefix"] == 1.0 and weights["queue"] == 4.0
