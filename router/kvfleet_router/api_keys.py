"""Who is asking, by API key: `Authorization: Bearer <key>` resolved to a tenant.

The keys live in a file (`kvfleet router --api-keys-file F`; on Kubernetes a Secret
mounted as that file), a YAML mapping of key to tenant:

    sk-kvfleet-3f9c0a...: team-a
    sk-kvfleet-77d1e4...: team-a       # a tenant may hold several keys
    sk-kvfleet-c02b95...: batch-jobs

Keys are secrets. Only their SHA-256 digests are kept in memory; a presented key is hashed
and its digest compared with `hmac.compare_digest`, so neither the lookup nor the
comparison takes time that depends on how much of a key a guess got right. No key (nor
a line of the file, which YAML errors would quote) ever appears in an error, a log line or
a metric: problems name the entry's position. The file is read again when it changes
(checked at most every `reload_every_s`), as a mounted Secret changes in place; a file
that became invalid keeps the keys in force and logs one line saying why.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Mapping

import yaml

from kvfleet_router.config import ConfigError

log = logging.getLogger(__name__)

MIN_KEY_CHARS = 16  # shorter keys are guessable; refused when the file is read
MAX_TENANT_CHARS = 128


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(text: str, where: str) -> dict[bytes, str]:
    """digest -> tenant; raises ConfigError that never quotes the file's contents."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" near line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: not valid YAML{line}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of API key to tenant")
    out: dict[bytes, str] = {}
    for i, (key, tenant) in enumerate(data.items(), start=1):
        if not isinstance(key, str) or len(key.strip()) < MIN_KEY_CHARS or key != key.strip():
            raise ConfigError(f"{where}: entry {i}: the key must be a string of at least "
                              f"{MIN_KEY_CHARS} characters without surrounding spaces")
        if not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_TENANT_CHARS:
            raise ConfigError(f"{where}: entry {i}: the tenant must be a string of 1 to "
                              f"{MAX_TENANT_CHARS} characters")
        out[_digest(key)] = tenant
    return out


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, or None."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


class ApiKeys:
    """The key -> tenant table of one file, re-read when the file changes."""

    def __init__(self, path: str, reload_every_s: float = 2.0,
                 stat: Callable[[str], os.stat_result] = os.stat) -> None:
        self.path = path
        self.reload_every_s = reload_every_s
        self._stat = stat
        self._checked_s = float("-inf")
        self._stamp: tuple[float, int, int] | None = None
        self._tenants: Mapping[bytes, tuple[bytes, str]] = {}
        self._load()  # at start-up a bad file is fatal (ConfigError)

    def _read_stamp(self) -> tuple[float, int, int]:
        st = self._stat(self.path)
        return (st.st_mtime, st.st_size, st.st_ino)

    def _load(self) -> None:
        try:
            stamp = self._read_stamp()
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read API keys: {exc.strerror}") from None
        self._tenants = {d: (d, t) for d, t in parse_keys(text, self.path).items()}
        self._stamp = stamp

    def __len__(self) -> int:
        return len(self._tenants)

    def maybe_reload(self, now: float) -> None:
        """Re-read the file if it changed; keep the keys in force if it is now unreadable."""
        if now - self._checked_s < self.reload_every_s:
            return
        self._checked_s = now
        try:
            if self._read_stamp() == self._stamp:
                return
            self._load()
            log.info("API keys reloaded from %s: %d key(s)", self.path, len(self._tenants))
        except (OSError, ConfigError) as exc:
            log.warning("API keys not reloaded, the previous ones stay in force: %s", exc)

    def tenant_of(self, key: str) -> str | None:
        """The tenant `key` belongs to, or None. The table is looked up by the key's
        SHA-256 digest, so its timing tells nothing about the key itself, and the digest
        found is compared again with `hmac.compare_digest`."""
        digest = _digest(key)
        entry = self._tenants.get(digest)
        if entry is None:
            return None
        known, tenant = entry
        return tenant if hmac.compare_digest(known, digest) else None
