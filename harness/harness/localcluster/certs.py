"""The PKI of a local control plane: one CA, the apiserver's serving cert, an admin client
cert in `system:masters`, and the service-account signing key pair."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .addresses import kubernetes_service_ip

VALIDITY = dt.timedelta(days=30)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def write_pki(directory: Path, extra_ips: Sequence[str] = ()) -> dict[str, Path]:
    """Write every key and certificate into `directory`; return their paths by role. The
    apiserver's cert also names `extra_ips` (where else it listens)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("toolrl-local-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, org: str | None, usage: x509.ObjectIdentifier, sans: list | None = None):
        key = _key()
        b = _builder(_name(cn, org), ca_name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, b.sign(ca_key, hashes.SHA256())

    serving_key, serving = leaf(
        "kube-apiserver",
        None,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            # the `kubernetes` Service's ClusterIP: the first address of the Service range
            x509.IPAddress(ipaddress.ip_address(kubernetes_service_ip())),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
        ],
    )
    admin_key, admin = leaf("toolrl-admin", "system:masters", ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    files = {
        "ca.crt": _pem_cert(ca),
        "ca.key": _pem_key(ca_key),
        "apiserver.crt": _pem_cert(serving),
        "apiserver.key": _pem_key(serving_key),
        "admin.crt": _pem_cert(admin),
        "admin.key": _pem_key(admin_key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    paths = {}
    for name, data in files.items():
        p = directory / name
        p.write_bytes(data)
        p.chmod(0o600)
        paths[name] = p
    return paths
