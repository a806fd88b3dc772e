"""A self-signed serving certificate for the ext_proc port when none is given.

GIE's reference picker does the same: gateways talk TLS to the picker without verifying
it (the Envoy cluster has no validation context), so traffic is encrypted by default and
a real certificate (--epp-cert-file/--epp-key-file, e.g. from cert-manager) adds identity.
"""

from __future__ import annotations

import datetime
import ipaddress


def self_signed(hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                days: int = 365) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM): EC P-256, SANs for `hosts`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvfleet-epp")])
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
