"""The control plane's credentials: its certificates and keys, and kubeconfig files."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from pathlib import Path

import yaml

from tests.cluster.pod_network import BRIDGE_IP


def write_pki(pki: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost and the pod network's bridge, and
    a service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    def key() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def pem_key(k: rsa.RSAPrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "longctx-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    serving_key = key()
    serving = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
               .issuer_name(ca_name).public_key(serving_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.SubjectAlternativeName([
                   x509.DNSName("localhost"), x509.DNSName("kubernetes.default.svc"),
                   x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                   x509.IPAddress(ipaddress.ip_address(BRIDGE_IP)),   # pods' API address
                   x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]), critical=False)
               .sign(ca_key, hashes.SHA256()))
    sa_key = key()
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (pki / "ca.key").write_bytes(pem_key(ca_key))
    (pki / "apiserver.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    (pki / "apiserver.key").write_bytes(pem_key(serving_key))
    (pki / "sa.key").write_bytes(pem_key(sa_key))
    (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, user: str) -> None:
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "longctx", "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "longctx", "context": {"cluster": "longctx", "user": user}}],
        "current-context": "longctx",
    }
    path.write_text(yaml.safe_dump(config))
