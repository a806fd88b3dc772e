import os

import kmock
import pytest
from kmock_shim import KubeShim, write_kubeconfig
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


@pytest.fixture
def kubectl_env(cluster, tmp_path):
    """The environment a real `kubectl` needs to talk to the kmock cluster as a user."""
    path = write_kubeconfig(tmp_path / "kubeconfig", str(cluster.url).rstrip("/"))
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "KUBECONFIG": str(path), "HOME": str(home)}
