"""Parsing and validating OpenSSH public keys (one ``authorized_keys`` line).

The key blob is decoded by ``cryptography``; we check that the declared type matches the
blob, that the size is acceptable, and compute the SHA256 fingerprint exactly as
``ssh-keygen -l`` prints it.
"""

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

from tenants.choices import SSHKeyType

MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384
MAX_KEY_LENGTH = 16 * 1024

_REFUSED_TYPES = {
    "ssh-dss": "DSA keys (ssh-dss) are refused: OpenSSH no longer accepts them; use ssh-ed25519",
    "sk-ssh-ed25519@openssh.com": "security-key (FIDO) keys are not supported yet",
    "sk-ecdsa-sha2-nistp256@openssh.com": "security-key (FIDO) keys are not supported yet",
}


class InvalidSSHKey(ValueError):
    """The key cannot be used; the message says why, for the person who pasted it."""


@dataclass(frozen=True)
class ParsedKey:
    key_type: str
    bits: int
    fingerprint: str
    comment: str
    normalized: str  # "type base64 comment", one line


def parse_public_key(text: str) -> ParsedKey:
    """Parse one OpenSSH public key line, or raise InvalidSSHKey saying what is wrong."""
    text = (text or "").strip()
    if not text:
        raise InvalidSSHKey("the key is empty")
    if len(text) > MAX_KEY_LENGTH:
        raise InvalidSSHKey(f"the key is longer than {MAX_KEY_LENGTH} characters")
    if text.startswith("-----BEGIN"):  # before the one-line check: a PEM block has many
        raise InvalidSSHKey(
            "this is a PEM block, maybe a private key; paste the public key "
            "(the .pub file, starting with ssh-ed25519 or ssh-rsa)"
        )
    if "\n" in text or "\r" in text:
        raise InvalidSSHKey("paste exactly one key, on one line")
    parts = text.split(None, 2)
    declared = parts[0]
    if declared in _REFUSED_TYPES:
        raise InvalidSSHKey(_REFUSED_TYPES[declared])
    if declared not in SSHKeyType.values:
        raise InvalidSSHKey(
            f"unknown key type {declared[:40]!r}; accepted: {', '.join(SSHKeyType.values)}"
        )
    if len(parts) < 2:
        raise InvalidSSHKey("the key data after the type is missing")
    blob_b64 = parts[1]
    comment = parts[2].strip() if len(parts) == 3 else ""
    try:
        blob = base64.b64decode(blob_b64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSSHKey("the key data is not valid base64") from None
    try:
        key = load_ssh_public_key(f"{declared} {blob_b64}".encode())
    except (ValueError, UnsupportedAlgorithm):
        raise InvalidSSHKey(
            f"the key data is not a valid {declared} key (truncated or of another type)"
        ) from None

    if isinstance(key, ed25519.Ed25519PublicKey):
        bits = 256
    elif isinstance(key, rsa.RSAPublicKey):
        bits = key.key_size
        if bits < MIN_RSA_BITS:
            raise InvalidSSHKey(f"RSA keys need at least {MIN_RSA_BITS} bits; this one has {bits}")
        if bits > MAX_RSA_BITS:
            raise InvalidSSHKey(f"RSA keys may have at most {MAX_RSA_BITS} bits; this has {bits}")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        bits = key.curve.key_size
    else:  # pragma: no cover - every accepted type is handled above
        raise InvalidSSHKey(f"unsupported key type {declared}")

    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    normalized = f"{declared} {blob_b64}" + (f" {comment}" if comment else "")
    return ParsedKey(
        key_type=declared,
        bits=bits,
        fingerprint=f"SHA256:{digest}",
        comment=comment[:255],
        normalized=normalized,
    )
