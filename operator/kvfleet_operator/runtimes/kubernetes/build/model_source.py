"""What each `model.source` scheme needs in an engine pod: volumes, mounts and env.

- `hf://ORG/REPO` (vLLM): downloaded at start into `HF_HOME`, an emptyDir by default or
  the claim in `BuildOptions.hf_cache_claim`; `HF_TOKEN` from `BuildOptions.hf_token_secret`
  when set.
- `pvc://CLAIM/PATH`: the claim mounted read-only at `engine_args.MODEL_MOUNT`, so the
  `--model` that `engine_args.model_ref` renders (`/models/PATH`) exists.
- `s3://` / `gs://` (vLLM): streamed by vLLM's Run:ai model streamer (`--load-format
  runai_streamer`, rendered by `engine_args`); credentials come from the pod's
  ServiceAccount (`BuildOptions.service_account`, e.g. IRSA or Workload Identity).
- `builtin://NAME` (builtin engine): shipped in kvfleet's image; nothing to mount.

Anything else raises `UnservableSpec` naming `spec.model.source`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.engine_args import MODEL_MOUNT
from kvfleet_operator.runtimes.kubernetes.build.errors import UnservableSpec
from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions

SOURCE_PATH = "spec.model.source"
HF_CACHE_MOUNT = "/hf-cache"
CLAIM_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # DNS-1123 subdomain


@dataclass(slots=True)
class ModelVolumes:
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)


def _vllm_only(spec: PoolSpec, scheme: str, why: str) -> None:
    if spec.engine.kind != "vllm":
        raise UnservableSpec(SOURCE_PATH, f"{scheme}:// needs engine.kind: vllm on Kubernetes "
                             f"({why}); use pvc://CLAIM/PATH with a GGUF file or HF folder")


def _hf(spec: PoolSpec, options: BuildOptions) -> ModelVolumes:
    _vllm_only(spec, "hf", "the builtin engine downloads nothing")
    if options.hf_cache_claim:
        volume = {"name": "hf-cache",
                  "persistentVolumeClaim": {"claimName": options.hf_cache_claim}}
    else:
        volume = {"name": "hf-cache", "emptyDir": {}}
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": HF_CACHE_MOUNT}]
    if options.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": options.hf_token_secret, "key": options.hf_token_key}}})
    return ModelVolumes([volume], [{"name": "hf-cache", "mountPath": HF_CACHE_MOUNT}], env)


def _pvc(spec: PoolSpec, options: BuildOptions) -> ModelVolumes:
    claim = (spec.model.source or "").partition("://")[2].partition("/")[0]
    if len(claim) > 253 or not re.fullmatch(CLAIM_PATTERN, claim):
        raise UnservableSpec(SOURCE_PATH, f"pvc://{claim}/...: {claim!r} is not a valid "
                             "PersistentVolumeClaim name")
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    return ModelVolumes([volume], [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}])


def _object_store(spec: PoolSpec, options: BuildOptions) -> ModelVolumes:
    _vllm_only(spec, spec.model.scheme, "it is streamed by vLLM's Run:ai model streamer")
    return ModelVolumes()


def _builtin(spec: PoolSpec, options: BuildOptions) -> ModelVolumes:
    return ModelVolumes()


def _file(spec: PoolSpec, options: BuildOptions) -> ModelVolumes:
    raise UnservableSpec(SOURCE_PATH, "file:// paths exist only on the machine that runs "
                         "`kvfleet up`; on Kubernetes use pvc://CLAIM/PATH")


SCHEMES: dict[str, Callable[[PoolSpec, BuildOptions], ModelVolumes]] = {
    "hf": _hf, "pvc": _pvc, "s3": _object_store, "gs": _object_store, "builtin": _builtin,
    "file": _file,
}


def model_volumes(spec: PoolSpec, options: BuildOptions) -> ModelVolumes:
    scheme = spec.model.scheme
    if scheme not in SCHEMES:
        raise UnservableSpec(SOURCE_PATH, f"the Kubernetes runtime cannot serve {scheme}:// "
                             "sources")
    return SCHEMES[scheme](spec, options)
