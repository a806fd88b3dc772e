from kvfleet_router.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker


def test_ejects_after_consecutive_failures_and_half_opens():
    b = CircuitBreaker(eject_after_errors=2, eject_base_s=1.0, eject_max_s=3.0)
    assert not b.record_failure(0.0)
    b.record_success()  # resets the streak
    assert not b.record_failure(0.0)
    assert b.record_failure(0.0)  # second in a row: ejected
    assert b.current_state(0.5) == OPEN and not b.can_attempt(0.5)
    assert b.current_state(1.0) == HALF_OPEN and b.can_attempt(1.0)
    b.on_attempt(1.0)
    assert not b.can_attempt(1.0)  # only one trial at a time
    assert b.record_failure(1.1)  # failed trial: open again, doubled
    assert b.open_until == 1.1 + 2.0
    b.on_attempt(3.1)
    assert b.record_failure(3.1)
    assert b.open_until == 3.1 + 3.0  # capped at eject_max_s
    b.on_attempt(6.1)
    b.record_success()
    assert b.current_state(6.1) == CLOSED and b.eject_s == 1.0
    assert b.num_ejections == 3


def test_released_trial_lets_another_through():
    b = CircuitBreaker(eject_after_errors=1, eject_base_s=1.0)
    b.record_failure(0.0)
    b.on_attempt(2.0)
    assert not b.can_attempt(2.0)
    b.release_trial()
    assert b.can_attempt(2.0)
