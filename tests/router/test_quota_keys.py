"""The API-key file (api_keys.py): parsed into digests, refused in one line that never
quotes a key, and the Bearer header read as OpenAI clients send it."""

import pytest
from kvfleet_router.api_keys import ApiKeys, bearer_key, parse_keys
from kvfleet_router.config import ConfigError

SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize("text,message", [
    (f"{SECRET}: ''\n", "entry 1: the tenant must be a string of 1 to 128 characters"),
    ("ok-key-0000000000000000: a\nsk-short: b\n", "entry 2: the key must be a string of at "
                                                     "least 16 characters"),
    (f"- {SECRET}\n", "must be a mapping of API key to tenant"),
    (f"{SECRET}: [a\n", "not valid YAML near line"),
    (f"{SECRET}: {{tenant: a}}\n", "entry 1: the tenant must be a string"),
])
def test_a_bad_key_file_is_one_line_that_never_quotes_a_key(text, message):
    with pytest.raises(ConfigError) as exc:
        parse_keys(text, "keys.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("keys.yaml: ")
    assert SECRET not in str(exc.value) and "sk-short" not in str(exc.value)


def test_keys_resolve_to_tenants_and_only_digests_are_kept(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(f"{SECRET}: team-a\nsk-live-fedcba9876543210: team-a\n")
    keys = ApiKeys(str(path))
    assert len(keys) == 2
    assert keys.tenant_of(SECRET) == "team-a"
    assert keys.tenant_of(SECRET + "x") is None and keys.tenant_of(SECRET[:-1]) is None
    assert SECRET not in repr(vars(keys))  # digests, not keys


def test_an_unreadable_key_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read API keys"):
        ApiKeys(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("header,key", [(f"Bearer {SECRET}", SECRET),
                                        (f"bearer  {SECRET} ", SECRET),
                                        (f"Basic {SECRET}", None), ("Bearer ", None),
                                        (None, None), ("", None)])
def test_the_bearer_key_is_read_from_the_authorization_header(header, key):
    assert bearer_key(header) == key


@pytest.mark.parametrize("key,tenant,ok", [
    ("k" * 16, "t", True), ("k" * 15, "t", False),  # the shortest key allowed, one less
    ("k" * 16, "t" * 128, True), ("k" * 16, "t" * 129, False),  # the longest tenant, one more
])
def test_key_and_tenant_lengths_at_their_bounds(key, tenant, ok):
    if ok:
        assert list(parse_keys(f"{key}: {tenant}\n", "keys.yaml").values()) == [tenant]
    else:
        with pytest.raises(ConfigError, match="entry 1: the (key|tenant) must be"):
            parse_keys(f"{key}: {tenant}\n", "keys.yaml")


def test_a_yaml_error_names_its_line():
    # the second entry's value holds a second colon: a YAML error on line 2
    with pytest.raises(ConfigError, match=r"not valid YAML near line 2$"):
        parse_keys(f"{SECRET}: a\nsk-live-fedcba9876543210: b: c\n{SECRET}x: d\n", "keys.yaml")


def test_the_file_is_checked_again_after_reload_every_s(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(f"{SECRET}: team-a\n")
    keys = ApiKeys(str(path), reload_every_s=2.0)
    keys.maybe_reload(10.0)
    path.write_text(f"{SECRET}: team-b\nsk-live-fedcba9876543210: team-c\n")  # size changes
    keys.maybe_reload(11.9)
    assert keys.tenant_of(SECRET) == "team-a"  # checked 1.9 s ago: not yet
    keys.maybe_reload(12.0)
    assert keys.tenant_of(SECRET) == "team-b"  # 2 s since the last check: read again
