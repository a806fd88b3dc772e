"""How the Endpoint Picker front is served (`kvfleet router --epp-*` flags)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_FALLBACKS = 8


@dataclass(slots=True)
class EppOptions:
    port: int
    host: str = "127.0.0.1"
    cert_file: str | None = None  # PEM; with key_file. Neither: a self-signed pair
    key_file: str | None = None
    is_insecure: bool = False  # plaintext gRPC (tests, or a mesh that adds mTLS itself)
    num_fallbacks: int = 0  # ordered alternatives after the primary in the endpoint list
    role: str = "unified"  # the engine role picked for (P/D pools: see docs/gateway.md)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--epp-port {self.port} is out of range")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("--epp-cert-file and --epp-key-file go together")
        if self.is_insecure and self.cert_file is not None:
            raise ValueError("--epp-insecure and --epp-cert-file exclude each other")
        if not 0 <= self.num_fallbacks <= MAX_FALLBACKS:
            raise ValueError(f"--epp-fallbacks must be in [0, {MAX_FALLBACKS}]")
