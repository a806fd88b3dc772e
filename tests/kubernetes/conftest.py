import kmock
import pytest
from kmock_shim import KubeShim


@pytest.fixture
async def cluster():
    async with KubeShim() as shim, kmock.Server(shim):
        shim.declare()
        yield shim
