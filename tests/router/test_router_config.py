import pytest
from kvfleet_router.config import ConfigError, RouterConfig, load_file

GOOD = {
    "version": 4,
    "endpoints": [{"name": "a", "url": "http://127.0.0.1:8001/", "role": "decode",
                   "state": "draining", "capacity": 8, "prefix_mode": "precise"}],
    "policy": {"name": "slo", "picker": "power-of-two", "weights": {"prefix": 1, "ucb": 0.5},
               "imbalance": {"abs_threshold": 2, "rel_threshold": 1.2}},
    "queue": {"max_size": 3},
}


def test_round_trip_keeps_every_field():
    cfg = RouterConfig.from_dict(GOOD)
    assert cfg.endpoints[0].url == "http://127.0.0.1:8001"  # trailing slash dropped
    assert cfg.endpoints[0].is_draining
    assert cfg.policy.weights == {"prefix": 1.0, "ucb": 0.5}
    assert RouterConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("data, path", [
    ({"endpoints": [{"name": "a", "url": "http://x:1", "role": "boss"}]},
     "endpoints[0].role: must be one of unified, prefill, decode; got 'boss'"),
    ({"endpoints": [{"name": "a", "url": "ftp://x:1"}]},
     "endpoints[0].url: must look like http://host:port, got 'ftp://x:1'"),
    ({"endpoints": [{"name": "a", "url": "http://x:1/v1"}]}, "endpoints[0].url:"),
    ({"endpoints": [{"url": "http://x:1"}]}, "endpoints[0].name: required"),
    ({"endpoints": [{"name": "a", "url": "http://x:1"}, {"name": "a", "url": "http://y:1"}]},
     "endpoints[1].name: duplicate"),
    ({"endpoints": [{"name": "a", "url": "http://x:1", "capacity": 0}]}, "endpoints[0].capacity:"),
    ({"endpoints": [{"name": "a", "url": "http://x:1", "capacity": 1.5}]},
     "endpoints[0].capacity: must be an integer in [1, 1000000], got 1.5"),
    ({"endpoints": {"a": 1}}, "endpoints: must be a list, got mapping"),
    ({"policy": {"name": "fastest"}}, "policy.name:"),
    ({"policy": {"picker": "best"}}, "policy.picker:"),
    ({"policy": {"weights": {"magic": 1}}},
     "policy.weights.magic: unknown scorer; known: prefix, queue"),
    ({"policy": {"weights": {"prefix": -1}}}, "policy.weights.prefix:"),
    ({"policy": {"weights": {"prefix": "x"}}},
     "policy.weights.prefix: must be a finite number in [0, 1000], got string"),
    ({"policy": {"imbalance": {"rel_threshold": 0.5}}}, "policy.imbalance.rel_threshold:"),
    ({"policy": {"allow_override": "yes"}}, "policy.allow_override: must be a boolean, got string"),
    ({"version": -1}, "version:"),
    ({"version": "7"}, "version: must be an integer in [0, 9223372036854775807], got string"),
    ({"version": True}, "version: must be an integer in [0, 9223372036854775807], got boolean"),
    ({"schema": "other/v9"}, "schema:"),
    ({"surprise": 1}, "surprise: unknown field"),
    ({"queue": {"timeout_s": -1}}, "queue.timeout_s:"),
    ({"signals": {"poll_interval_s": 2, "stale_after_s": 1}},
     "signals.stale_after_s: must be >= poll_interval_s (1 < 2)"),
    ({"health": {"eject_base_s": 5, "eject_max_s": 1}},
     "health.eject_max_s: must be >= eject_base_s (1 < 5)"),
    ({"timeouts": {"connect_s": 0}}, "timeouts.connect_s:"),
    ([1, 2], "<root>: must be a mapping, got list"),
    ({"policy": {"weights": {1: 1.0}}}, "policy.weights: keys must be strings, got integer"),
    ({"policy": None}, "policy: must be a mapping, got null"),
    ({"endpoints": [{"name": "", "url": "http://x:1"}]}, "endpoints[0].name: must not be empty"),
    ({"pd": {"decider": "coin"}}, "pd.decider: must be one of uncached-tokens; got 'coin'"),
])
def test_bad_config_names_the_field(data, path):
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict(data)
    assert str(err.value).startswith(path), str(err.value)


def test_load_file_reports_yaml_and_missing_files_on_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoints: [\n")
    with pytest.raises(ConfigError) as err:
        load_file(str(bad))
    assert "not valid YAML" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_file(str(tmp_path / "missing.yaml"))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_file(str(empty)).version == 0
    ok = tmp_path / "ok.yaml"
    ok.write_text("version: 2\nendpoints:\n  - {name: a, url: 'http://127.0.0.1:9'}\n")
    assert load_file(str(ok)).endpoints[0].name == "a"
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("version: 2\npolicy: {name: nope}\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml: policy.name:"):
        load_file(str(wrong))
