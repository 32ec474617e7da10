"""The ext_proc port's certificate: the operator's, or a self-signed one made at start.

Gateways dial the EPP over TLS and, like the reference EPP's default, usually skip verification
of its certificate, so a fresh self-signed key pair per start is enough unless one is mounted
(`epp.cert_file` / `epp.key_file`).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def self_signed(hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM), valid for a year, for `hosts` (names or IP addresses)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prefixgate-epp")])
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def key_pair(cert_file: str | None, key_file: str | None) -> tuple[bytes, bytes]:
    """The configured pair when both files are given, else a self-signed one."""
    if cert_file and key_file:
        return Path(key_file).read_bytes(), Path(cert_file).read_bytes()
    return self_signed()
