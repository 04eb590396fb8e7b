"""tenants/sshkeys.py: parsing OpenSSH public keys, and the SSH key endpoint that uses it."""

import base64
import hashlib
import shutil
import subprocess
import warnings

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa

from tenants.models import SSHKey
from tenants.sshkeys import InvalidSSHKey, parse_public_key
from tests.factories import UserFactory

URL = "/api/v1/user/ssh-keys/"


def _openssh_public(private_key, comment: str = "") -> str:
    line = (
        private_key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return f"{line} {comment}" if comment else line


@pytest.fixture(scope="module")
def keys():
    """Real keys of every accepted type (and some refused ones), generated once."""
    with warnings.catch_warnings():  # cryptography deprecates DSA; we only need one to refuse
        warnings.simplefilter("ignore")
        dsa_line = _openssh_public(dsa.generate_private_key(key_size=1024))
    return {
        "dsa_line": dsa_line,
        "ed25519": ed25519.Ed25519PrivateKey.generate(),
        "rsa2048": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "rsa3072": rsa.generate_private_key(public_exponent=65537, key_size=3072),
        "rsa1024": rsa.generate_private_key(public_exponent=65537, key_size=1024),
        "p256": ec.generate_private_key(ec.SECP256R1()),
        "p384": ec.generate_private_key(ec.SECP384R1()),
        "p521": ec.generate_private_key(ec.SECP521R1()),
    }


ACCEPTED = [
    ("ed25519", "ssh-ed25519", 256),
    ("rsa2048", "ssh-rsa", 2048),
    ("rsa3072", "ssh-rsa", 3072),
    ("p256", "ecdsa-sha2-nistp256", 256),
    ("p384", "ecdsa-sha2-nistp384", 384),
    ("p521", "ecdsa-sha2-nistp521", 521),
]


# --- parse_public_key ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "key_type", "bits"), ACCEPTED)
def test_valid_key_parses_with_type_bits_and_sha256_fingerprint(keys, name, key_type, bits):
    line = _openssh_public(keys[name], "alice@laptop")
    parsed = parse_public_key(line)
    assert parsed.key_type == key_type
    assert parsed.bits == bits
    blob = base64.b64decode(line.split()[1])
    expected = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert parsed.fingerprint == f"SHA256:{expected}"
    assert parsed.comment == "alice@laptop"
    assert parsed.normalized == line


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")
def test_fingerprint_and_bits_match_ssh_keygen(keys, tmp_path):
    for name, _key_type, _bits in ACCEPTED:
        path = tmp_path / f"{name}.pub"
        line = _openssh_public(keys[name], f"{name}@test")
        path.write_text(line + "\n")
        out = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        # "<bits> SHA256:<digest> <comment> (<TYPE>)"
        parsed = parse_public_key(line)
        assert (str(parsed.bits), parsed.fingerprint) == (out[0], out[1]), name


def test_whitespace_and_comment_with_spaces_are_normalized(keys):
    line = _openssh_public(keys["ed25519"])
    parsed = parse_public_key(f"  {line}   my  work key  \n")
    assert parsed.comment == "my  work key"
    assert parsed.normalized == f"{line} my  work key"


def _blob(keys, name):
    return _openssh_public(keys[name]).split()[1]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda k: "", "empty"),
        (lambda k: "   \n ", "empty"),
        (lambda k: "ssh-ed25519", "missing"),
        (lambda k: "ssh-ed25519 AAAA$$$not*base64", "not valid base64"),
        (lambda k: f"ssh-ed25519 {_blob(k, 'ed25519')[:-12]}", "truncated"),
        (lambda k: f"ssh-rsa {_blob(k, 'ed25519')}", "not a valid ssh-rsa key"),
        (lambda k: f"ecdsa-sha2-nistp256 {_blob(k, 'p384')}", "not a valid ecdsa-sha2-nistp256"),
        (lambda k: k["dsa_line"], "DSA keys (ssh-dss) are refused"),
        (lambda k: _openssh_public(k["rsa1024"]), "at least 2048 bits; this one has 1024"),
        (lambda k: "ssh-foo AAAAB3NzaC1yc2E", "unknown key type 'ssh-foo'"),
        (lambda k: "sk-ssh-ed25519@openssh.com AAAA", "security-key"),
        (lambda k: f"{_openssh_public(k['ed25519'])}\n{_openssh_public(k['p256'])}", "one line"),
        (lambda k: "ssh-ed25519 " + "A" * 20000, "longer than"),
    ],
    ids=[
        "empty",
        "blank",
        "no-data",
        "bad-base64",
        "truncated",
        "type-mismatch",
        "curve-mismatch",
        "dsa",
        "rsa-1024",
        "unknown-type",
        "security-key",
        "two-lines",
        "too-long",
    ],
)
def test_malformed_key_says_what_is_wrong(keys, make, reason):
    with pytest.raises(InvalidSSHKey) as e:
        parse_public_key(make(keys))
    assert reason in str(e.value)


@pytest.mark.parametrize(
    "private_format", [serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.OpenSSH]
)
def test_pasted_private_key_is_recognized_as_such(keys, private_format):
    pem = (
        keys["ed25519"]
        .private_bytes(serialization.Encoding.PEM, private_format, serialization.NoEncryption())
        .decode()
    )
    assert pem.count("\n") > 2  # a real, multi-line block
    with pytest.raises(InvalidSSHKey, match="maybe a private key"):
        parse_public_key(pem)


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_add_key_over_api_stores_parsed_fields(client_for, keys):
    user = UserFactory()
    line = _openssh_public(keys["p384"], "bob@hpc")
    response = client_for(user).post(URL, {"public_key": line}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    parsed = parse_public_key(line)
    assert body["key_type"] == "ecdsa-sha2-nistp384"
    assert body["bits"] == 384
    assert body["fingerprint"] == parsed.fingerprint
    assert body["name"] == "bob@hpc"  # named after its comment when no name is given
    key = SSHKey.objects.get(user=user)
    assert (key.public_key, key.fingerprint, key.bits) == (line, parsed.fingerprint, 384)


MALFORMED_OVER_API = [
    ("empty", lambda k: "", "blank"),
    ("bad-base64", lambda k: "ssh-ed25519 AAAA$$$not*base64", "not valid base64"),
    ("truncated", lambda k: f"ssh-ed25519 {_blob(k, 'ed25519')[:-12]}", "truncated"),
    ("type-mismatch", lambda k: f"ssh-rsa {_blob(k, 'ed25519')}", "not a valid ssh-rsa key"),
    ("dsa", lambda k: k["dsa_line"], "DSA keys (ssh-dss) are refused"),
    ("rsa-1024", lambda k: _openssh_public(k["rsa1024"]), "at least 2048 bits"),
    (
        "pem-private-key",
        lambda k: (
            k["rsa2048"]
            .private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
            .decode()
        ),
        "maybe a private key",
    ),
    (
        "two-lines",
        lambda k: f"{_openssh_public(k['ed25519'])}\n{_openssh_public(k['p256'])}",
        "one line",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("make", "reason"),
    [(make, reason) for _, make, reason in MALFORMED_OVER_API],
    ids=[name for name, _, _ in MALFORMED_OVER_API],
)
def test_malformed_key_over_api_is_400_naming_public_key(client_for, keys, make, reason):
    user = UserFactory()
    response = client_for(user).post(URL, {"public_key": make(keys)}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid"
    assert reason in body["details"]["public_key"][0]
    assert body["message"].startswith("public_key: ")
    assert not SSHKey.objects.filter(user=user).exists()


@pytest.mark.django_db
def test_same_key_twice_is_409_even_with_another_comment(client_for, keys):
    user = UserFactory()
    client = client_for(user)
    line = _openssh_public(keys["ed25519"])
    assert client.post(URL, {"public_key": f"{line} one", "name": "a"}).status_code == 201
    response = client.post(URL, {"public_key": f"{line} two", "name": "b"})
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "conflict"
    assert "named 'a'" in body["details"]["public_key"][0]
    assert SSHKey.objects.filter(user=user).count() == 1


@pytest.mark.django_db
def test_same_name_twice_is_409_naming_name(client_for, keys):
    client = client_for(UserFactory())
    first = {"public_key": _openssh_public(keys["ed25519"]), "name": "laptop"}
    second = {"public_key": _openssh_public(keys["p256"]), "name": "laptop"}
    assert client.post(URL, first).status_code == 201
    response = client.post(URL, second)
    assert response.status_code == 409
    assert "name" in response.json()["details"]


@pytest.mark.django_db
def test_two_users_may_register_the_same_key(client_for, keys):
    line = _openssh_public(keys["ed25519"])
    assert client_for(UserFactory()).post(URL, {"public_key": line}).status_code == 201
    assert client_for(UserFactory()).post(URL, {"public_key": line}).status_code == 201


@pytest.mark.django_db
def test_keys_are_private_to_their_user(client_for, keys):
    alice, bob = UserFactory(), UserFactory()
    created = client_for(alice).post(URL, {"public_key": _openssh_public(keys["ed25519"])})
    key_id = created.json()["id"]
    assert client_for(bob).get(URL).json()["results"] == []
    assert client_for(bob).get(f"{URL}{key_id}/").status_code == 404
    assert client_for(bob).delete(f"{URL}{key_id}/").status_code == 404
    assert client_for(alice).delete(f"{URL}{key_id}/").status_code == 204
    assert not SSHKey.objects.filter(pk=key_id).exists()
