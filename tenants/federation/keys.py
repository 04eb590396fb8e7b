"""Self-signed key pairs for SAML (the SP's own, and the demo IdP's and test federation's).

Written once, whole, into a folder and kept: a second call returns the same pair."""

import datetime
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID


def ensure_keypair(folder: Path, name: str, common_name: str) -> tuple[Path, Path]:
    """``(key.pem, cert.pem)`` under ``folder``, made (RSA 2048, ten years) if missing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.crt"
    if key_path.exists() and cert_path.exists():
        return key_path, cert_path
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    for path, data, mode in (
        (key_path, key_pem, 0o600),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644),
    ):
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    return key_path, cert_path


def cert_body(cert_path: Path) -> str:
    """The base64 body of a PEM certificate (what SAML metadata carries)."""
    lines = Path(cert_path).read_text().strip().splitlines()
    return "".join(line for line in lines if not line.startswith("-----"))
