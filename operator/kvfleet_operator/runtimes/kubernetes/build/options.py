"""What the builders take besides the pool: tokens, images, and cluster-side choices."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvfleet_operator.api.vllm_compat import VLLM_IMAGE

# kvfleet's own image (router and builtin engine). Pinned to this release; not published yet.
KVFLEET_IMAGE = "ghcr.io/kvfleet/kvfleet:0.1.0"
# vLLM pods without `engine.image` run VLLM_IMAGE: the release engine_args renders flags for
# (vllm_compat), so the image and the flag list change together.
__all__ = ["KVFLEET_IMAGE", "VLLM_IMAGE"]

OPERATOR_NAMESPACE = "kvfleet-system"
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "kvfleet-operator"}


@dataclass(frozen=True, slots=True)
class Tokens:
    """The pool's two bearer tokens. Generating them once and keeping them across reconciles
    is the runtime's job; the builders only place them in Secrets (never in args or env)."""

    admin: str
    engine: str

    def __post_init__(self) -> None:
        if not self.admin or not self.engine:
            raise ValueError("both tokens must be non-empty")

    def __repr__(self) -> str:  # never print a token by accident
        return "Tokens(admin=<hidden>, engine=<hidden>)"


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """Cluster-side choices the InferencePool spec does not carry.

    - `hf_token_secret` / `hf_token_key`: a Secret holding an HF token for `hf://` models
      (none by default: public models need none).
    - `hf_cache_claim`: a PersistentVolumeClaim (ReadWriteMany when replicas spread over
      nodes) for the `hf://` download cache; default an emptyDir, so each pod downloads.
    - `service_account`: the engine pods' ServiceAccount (e.g. one bound to a cloud role
      for `s3://` / `gs://` sources); default the namespace's `default`.
    - `operator_namespace` / `operator_pod_labels`: where the operator runs, for the
      engines' NetworkPolicy.
    """

    hf_token_secret: str | None = None
    hf_token_key: str = "token"
    hf_cache_claim: str | None = None
    service_account: str | None = None
    operator_namespace: str = OPERATOR_NAMESPACE
    operator_pod_labels: dict[str, str] = field(default_factory=lambda: dict(OPERATOR_POD_LABELS))
