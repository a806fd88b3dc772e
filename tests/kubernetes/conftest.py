import kmock
import pytest
from kmock_shim import KubeShim
from kubernetes.aio import client as kclient
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import KubeClient


@pytest.fixture
async def cluster():
    async with KubeShim() as shim, kmock.Server(shim):
        shim.declare()
        yield shim


@pytest.fixture
async def client(cluster):
    kube = KubeClient(kclient.Configuration(host=str(cluster.url).rstrip("/")))
    yield kube
    await kube.close()
