import pytest
from e2e_fleet import Fleet


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a whole-fleet run of tens of seconds (still part of `make test`)"
    )


@pytest.fixture
def start_fleet(tmp_path):
    fleets = []

    def start(pool: str, *extra_args: str) -> Fleet:
        fleet = Fleet(pool, tmp_path / f"fleet{len(fleets)}", extra_args=extra_args)
        fleets.append(fleet)
        return fleet

    yield start
    for fleet in fleets:
        fleet.cleanup()
