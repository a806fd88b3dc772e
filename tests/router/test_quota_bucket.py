"""Per-tenant quotas, the pure part (quota.py): bucket arithmetic at its boundaries, the
limits held over any minute of a flood (clock injected), settling, reloads, bounded memory."""

import pytest
from kvfleet_router.config import ConfigError, QuotasConfig, RouterConfig, TenantQuota
from kvfleet_router.quota import REQUESTS, TOKENS, QuotaBook, TokenBucket, duration_text


def _book(rpm=0, tpm=0, burst_s=2.0, **tenants):
    return QuotaBook(QuotasConfig(default=TenantQuota(rpm=rpm, tpm=tpm), burst_s=burst_s,
                                  tenants={k: TenantQuota(**v) for k, v in tenants.items()}))


def test_rpm_bucket_refills_at_limit_over_60_exactly_at_the_boundary():
    book = _book(rpm=60, burst_s=2.0)  # 1 request/s, bucket of 2
    assert book.admit("a", 10, 0.0).is_admitted
    assert book.admit("a", 10, 0.0).is_admitted
    third = book.admit("a", 10, 0.0)
    assert not third.is_admitted and third.limit_name == REQUESTS
    assert third.retry_after_s == pytest.approx(1.0)
    assert not book.admit("a", 10, 0.999).is_admitted  # one request refills in 1 s
    assert book.admit("a", 10, 1.0).is_admitted
    assert not book.admit("a", 10, 1.0).is_admitted


def test_headers_state_counts_down_and_resets_to_full():
    book = _book(rpm=600, tpm=6000, burst_s=6.0)  # depths: 60 requests, 600 tokens
    v = book.admit("a", 100, 0.0)
    by = {s.name: s for s in v.states}
    assert (by[REQUESTS].limit, by[REQUESTS].remaining) == (600, 59)
    assert (by[TOKENS].limit, by[TOKENS].remaining) == (6000, 500)
    assert by[TOKENS].reset_s == pytest.approx(1.0)  # 100 tokens at 100/s
    assert by[REQUESTS].reset_s == pytest.approx(0.1)


def test_a_token_refusal_charges_no_request_and_names_tokens():
    book = _book(rpm=60, tpm=600, burst_s=10.0)  # 10 requests, 100 tokens
    assert book.admit("a", 90, 0.0).is_admitted
    refused = book.admit("a", 50, 0.0)
    assert not refused.is_admitted and refused.limit_name == TOKENS
    assert refused.retry_after_s == pytest.approx(4.0)  # 40 missing at 10 tokens/s
    requests = next(s for s in refused.states if s.name == REQUESTS)
    assert requests.remaining == 9  # the refused one was not counted


def test_more_than_the_whole_tpm_is_too_large_and_a_big_one_passes_on_a_full_bucket():
    book = _book(tpm=6000, burst_s=1.0)  # depth 100 tokens
    too_large = book.admit("a", 6001, 0.0)
    assert not too_large.is_admitted and too_large.is_too_large
    assert book.admit("a", 6000, 0.0).is_admitted  # bigger than the bucket: a full one
    debt = book.admit("a", 1, 0.0)
    assert not debt.is_admitted
    assert debt.retry_after_s == pytest.approx((5900 + 1) / 100)  # the debt is paid first


def test_settle_refunds_unused_tokens_up_to_the_depth_and_charges_extra_as_debt():
    book = _book(tpm=600, burst_s=10.0)  # depth 100, 10 tokens/s
    assert book.admit("a", 80, 0.0).is_admitted
    book.settle("a", charged=80, actual=30, now=0.0)  # 50 back: level 70
    assert book.admit("a", 70, 0.0).is_admitted
    assert not book.admit("a", 1, 0.0).is_admitted
    book.settle("a", charged=70, actual=90, now=0.0)  # 20 more: level -20
    refused = book.admit("a", 10, 0.0)
    assert refused.retry_after_s == pytest.approx(3.0)  # from -20 to 10 at 10/s
    book.settle("a", charged=0, actual=0, now=100.0)
    assert next(s for s in book.admit("a", 0, 100.0).states).remaining == 100  # capped


def _flood(book, tenant, rate_per_s, seconds, tokens_of):
    """Admission times of an open-loop flood; the clock is the loop's own."""
    admitted = []
    for i in range(int(rate_per_s * seconds)):
        now = i / rate_per_s
        tokens = tokens_of(i)
        if book.admit(tenant, tokens, now).is_admitted:
            admitted.append((now, tokens))
    return admitted


def _windows(admitted, seconds, what):
    """Admitted per sliding 60 s window, stepped by 1 s."""
    return [sum(what(t) for now, t in admitted if start <= now < start + 60)
            for start in range(0, int(seconds) - 59)]


def test_rpm_holds_within_5_percent_over_every_minute_of_a_flood():
    book = _book(rpm=600)  # default burst_s 2: the bucket holds 20 requests
    admitted = _flood(book, "a", rate_per_s=40, seconds=300, tokens_of=lambda i: 1)
    per_minute = _windows(admitted, 300, lambda t: 1)
    assert min(per_minute) >= 0.95 * 600
    assert max(per_minute) <= 1.05 * 600
    assert 600 < per_minute[0] <= 600 + 20  # the bucket's 20, once, in the first minute
    assert max(per_minute[60:]) <= 601  # then the refill rate alone


def test_tpm_holds_within_5_percent_over_every_minute_of_a_flood():
    book = _book(tpm=60_000)  # 1000 tokens/s, bucket of 2000
    admitted = _flood(book, "a", rate_per_s=50, seconds=300,
                      tokens_of=lambda i: 50 + (i * 37) % 200)  # 50..249 tokens
    per_minute = _windows(admitted, 300, lambda t: t)
    assert min(per_minute) >= 0.95 * 60_000
    assert max(per_minute) <= 1.05 * 60_000


def test_tenants_are_limited_apart_and_listed_ones_get_their_own_limits():
    book = _book(rpm=60, burst_s=1.0, vip={"rpm": 6000})
    assert book.admit("a", 1, 0.0).is_admitted
    assert not book.admit("a", 1, 0.0).is_admitted
    assert book.admit("b", 1, 0.0).is_admitted  # another tenant, its own bucket
    assert all(book.admit("vip", 1, 0.0).is_admitted for _ in range(100))


def test_no_limits_means_no_bucket_and_no_headers():
    book = _book()
    verdict = book.admit("anyone", 10**9, 0.0)
    assert verdict.is_admitted and verdict.states == ()
    assert len(book) == 0 and not book.is_limited("anyone")


def test_reload_keeps_the_level_cut_to_the_new_depth_and_unlimits_removed_tenants():
    book = _book(rpm=600, burst_s=6.0)  # depth 60
    for _ in range(50):
        book.admit("a", 1, 0.0)
    book.configure(QuotasConfig(default=TenantQuota(rpm=60), burst_s=6.0))  # depth 6
    states = book.admit("a", 1, 0.0).states
    assert states[0].remaining == 5  # 10 left, cut to 6, one taken
    book.configure(QuotasConfig())
    assert book.admit("a", 1, 0.0).states == () and len(book) == 0


def test_client_chosen_tenant_names_cannot_grow_the_table_past_its_bound():
    book = QuotaBook(QuotasConfig(default=TenantQuota(rpm=60)), max_tenants=100)
    for i in range(10_000):
        book.admit(f"t{i}", 1, float(i))  # each tenant's bucket is full again a second later
    assert len(book) <= 100


def test_bucket_refill_never_passes_its_depth():
    bucket = TokenBucket.full(per_min=60, burst=3, now=0.0)
    bucket.take(3, 0.0)
    bucket.refill(1000.0)
    assert bucket.level == 3


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (0.0169, "17ms"), (0.999, "999ms"),
                                          (1, "1s"), (1.5, "1.5s"), (9.816, "9.816s"),
                                          (360, "6m0s"), (90.25, "1m30.25s")])
def test_reset_durations_are_written_as_openai_writes_them(seconds, text):
    assert duration_text(seconds) == text


@pytest.mark.parametrize("quotas,message", [
    ({"default": {"rpm": -1}}, "quotas.default.rpm: must be an integer in [0, 1000000000], "
                               "got -1"),
    ({"tenants": {"a": {"tpm": 1.5}}}, "quotas.tenants.a.tpm: must be an integer"),
    ({"tenants": {"a": {"rps": 1}}}, "quotas.tenants.a.rps: unknown field"),
    ({"burst_s": 0}, "quotas.burst_s: must be a finite number in [0.01, 60], got 0"),
    ({"default_max_tokens": 0}, "quotas.default_max_tokens: must be an integer in [1, "),
])
def test_bad_quota_config_is_one_line_naming_the_field(quotas, message):
    with pytest.raises(ConfigError) as exc:
        RouterConfig.from_dict({"quotas": quotas})
    assert str(exc.value).startswith(message)


def test_quotas_are_off_by_default():
    cfg = RouterConfig()
    assert not cfg.quotas.is_enabled
    assert RouterConfig.from_dict({"quotas": {"tenants": {"a": {"tpm": 10}}}}).quotas.is_enabled


def test_a_drained_tenant_is_not_forgotten_when_new_names_flood_the_table():
    # Forgetting a full bucket gives nothing away (it would come back full); forgetting a
    # drained one would hand its tenant a fresh bucket. At the cap (4), the full buckets
    # go first and every drained one stays, still refused.
    book = QuotaBook(QuotasConfig(default=TenantQuota(rpm=60), burst_s=1.0), max_tenants=4)
    for t in ("a", "b"):
        assert book.admit(t, 1, 0.0).is_admitted  # depth 1: drained for a second
    for t in ("c", "d"):
        assert book.admit(t, 1, -10.0).is_admitted  # full again by now
    assert book.admit("e", 1, 0.0).is_admitted  # past the cap: c and d go
    assert len(book) == 3
    assert not book.admit("a", 1, 0.5).is_admitted and not book.admit("b", 1, 0.5).is_admitted


def test_past_the_cap_with_none_full_the_emptiest_three_quarters_stay():
    book = QuotaBook(QuotasConfig(default=TenantQuota(rpm=60), burst_s=4.0), max_tenants=8)
    for i in range(8):  # depth 4: tenant i asks i + 1 times at t = 0, t3 to t7 drain it
        for _ in range(i + 1):
            book.admit(f"t{i}", 1, 0.0)
    book.admit("new", 1, 0.0)
    assert len(book) == 6 + 1  # 3/4 of 8 kept, the emptiest, and the newcomer
    for i in range(3, 8):
        assert not book.admit(f"t{i}", 1, 0.0).is_admitted  # kept, still drained
    assert book.admit("t2", 1, 0.0).is_admitted  # kept with its 1 left
    assert not book.admit("t2", 1, 0.0).is_admitted
    # t0 (3 left) went, the fullest: it comes back with a fresh bucket of 4
    assert all(book.admit("t0", 1, 0.0).is_admitted for _ in range(4))


def test_a_full_bucket_resets_in_no_time():
    bucket = TokenBucket.full(per_min=60, burst=2, now=0.0)
    assert bucket.full_in_s(5.0) == 0.0 and bucket.wait_s(1, 5.0) == 0.0
    bucket.take(1, 5.0)
    assert bucket.full_in_s(5.0) == pytest.approx(1.0) and bucket.wait_s(1, 5.0) == 0.0
    assert duration_text(0.001) == "1ms" and duration_text(0.0004) == "1ms"


def test_one_request_a_minute_is_a_limit():
    book = _book(rpm=1)
    assert book.is_limited("a") and _book(tpm=1).is_limited("a") and not _book().is_limited("a")
    assert book.admit("a", 1, 0.0).is_admitted
    assert not book.admit("a", 1, 30.0).is_admitted
