import os

import kmock
import pytest
import yaml
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


@pytest.fixture
def kubectl_env(cluster, tmp_path):
    """The environment a real `kubectl` needs to talk to the kmock cluster as a user."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(cluster.url).rstrip("/")}}],
        "users": [{"name": "me", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "me"}}],
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "KUBECONFIG": str(path), "HOME": str(home)}
