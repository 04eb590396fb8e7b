"""The federation's metadata aggregate, and Kumo's SAML service-provider configuration.

``metadata_refresh`` fetches the aggregate (GakuNin's, eduGAIN's, or the demo IdP's), checks
that it is signed over its root by the federation's certificate and not past its
``validUntil``, and stores it in ``FederationMetadata``. A copy that fails the check is
never used: the last good one stays, the failure is audited, counted in the metric
``kumo_federation_metadata_failures_total`` and mailed to the operators.

``sp_config`` builds pysaml2's ``SPConfig`` from the stored copy; parsing a real aggregate
(thousands of entities) takes seconds, so each process keeps the parsed config until the
stored copy changes.
"""

import base64
import hashlib
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path

import httpx
from defusedxml import ElementTree
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from prometheus_client import Counter
from saml2 import BINDING_HTTP_POST
from saml2.config import SPConfig
from saml2.sigver import CryptoBackendXmlSec1, SignatureError

from controlplane import audit
from controlplane.choices import AuditOutcome
from tenants.federation.keys import ensure_keypair
from tenants.federation.models import FederationMetadata

log = logging.getLogger(__name__)

MD = "urn:oasis:names:tc:SAML:2.0:metadata"
DS = "http://www.w3.org/2000/09/xmldsig#"
ATTRIBUTE_MAPS = str(Path(__file__).with_name("attributemaps"))

REFRESH_FAILURES = Counter(
    "kumo_federation_metadata_failures_total",
    "Federation metadata refreshes refused (bad signature, expired, unreachable)",
)


class MetadataRejected(Exception):
    """The fetched aggregate must not be used; the message says why."""


def _parse_instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def verify_aggregate(document: bytes, cert_path: str | Path) -> tuple[int, datetime | None]:
    """Check a metadata aggregate; return (how many IdPs it lists, its validUntil).

    The root must carry an enveloped signature whose reference is the root itself (so no
    element can be wrapped around or beside the signed one), made with the federation's
    key (``xmlsec1 --verify`` against ``cert_path``), and ``validUntil`` must be ahead."""
    try:
        root = ElementTree.fromstring(document)
    except Exception as e:
        raise MetadataRejected(f"not XML: {e}") from None
    if root.tag not in (f"{{{MD}}}EntitiesDescriptor", f"{{{MD}}}EntityDescriptor"):
        raise MetadataRejected(f"the root is {root.tag}, not SAML metadata")
    signature = root.find(f"{{{DS}}}Signature")
    if signature is None:
        raise MetadataRejected("the aggregate is not signed")
    references = signature.findall(f"{{{DS}}}SignedInfo/{{{DS}}}Reference")
    root_id = root.get("ID", "")
    if len(references) != 1 or references[0].get("URI") not in ("", f"#{root_id}"):
        raise MetadataRejected("the signature does not cover the whole aggregate")
    if not Path(cert_path).is_file():
        raise MetadataRejected(f"no federation certificate at {cert_path}")
    try:
        CryptoBackendXmlSec1(settings.SAML_XMLSEC_BINARY).validate_signature(
            document.decode(), str(cert_path), "pem", root.tag.replace("}", ":")[1:], None
        )
    except SignatureError as e:
        raise MetadataRejected(f"the signature does not verify: {e}") from None
    except Exception as e:
        raise MetadataRejected(f"the signature could not be checked: {e}") from None
    valid_until = None
    if root.get("validUntil"):
        valid_until = _parse_instant(root.get("validUntil"))
        if valid_until <= timezone.now():
            raise MetadataRejected(f"the aggregate expired at {valid_until.isoformat()}")
    idps = root.iter(f"{{{MD}}}IDPSSODescriptor")
    return sum(1 for _ in idps), valid_until


def _fetch(source: str) -> bytes:
    if source.startswith(("http://", "https://")):
        response = httpx.get(
            source, timeout=settings.SAML_METADATA_TIMEOUT_S, follow_redirects=True
        )
        response.raise_for_status()
        return response.content
    return Path(source).read_bytes()


def metadata_refresh(*, source: str | None = None) -> FederationMetadata:
    """Fetch and check the aggregate; keep it if good, keep the last good copy if not."""
    source = source or settings.SAML_METADATA_URL
    row, _ = FederationMetadata.objects.get_or_create(source=source)
    try:
        document = _fetch(source)
        idp_count, valid_until = verify_aggregate(document, settings.SAML_FEDERATION_CERT)
    except (MetadataRejected, httpx.HTTPError, OSError) as e:
        reason = str(e) or type(e).__name__
        _refused(row, reason)
        return row
    with transaction.atomic():
        row = FederationMetadata.objects.select_for_update().get(pk=row.pk)
        sha = hashlib.sha256(document).hexdigest()
        changed = sha != row.sha256
        row.document, row.sha256 = document.decode(), sha
        row.idp_count, row.valid_until, row.fetched_at = idp_count, valid_until, timezone.now()
        row.last_error = ""
        row.save()
        if changed:
            audit.record(
                "federation.metadata_refresh",
                row,
                detail={"idps": idp_count, "sha256": sha, "valid_until": str(valid_until)},
            )
    return row


def _refused(row: FederationMetadata, reason: str) -> None:
    log.error("federation metadata %s refused, keeping the last good copy: %s", row, reason)
    REFRESH_FAILURES.inc()
    with transaction.atomic():
        FederationMetadata.objects.filter(pk=row.pk).update(
            last_error=reason[:2000], last_failure_at=timezone.now()
        )
        audit.record(
            "federation.metadata_refresh",
            row,
            outcome=AuditOutcome.FAILED,
            detail={"reason": reason[:500], "kept_sha256": row.sha256},
        )
    row.refresh_from_db()
    from tenants.models import User

    operators = sorted(
        User.objects.filter(is_staff=True, is_active=True)
        .exclude(email="")
        .values_list("email", flat=True)
    )
    if operators:
        send_mail(
            subject="[Kumo] federation metadata refused",
            message=(
                f"The metadata from {row.source} was refused: {reason}\n"
                f"Logins go on with the copy fetched at {row.fetched_at} "
                f"(valid until {row.valid_until})."
            ),
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=operators,
            fail_silently=True,
        )


# --- the SP configuration ---------------------------------------------------------------------

_cache: dict = {}
_cache_lock = threading.Lock()


def sp_keypair() -> tuple[str, str]:
    """The SP's signing/encryption key pair: configured, or generated once under var/."""
    if settings.SAML_SP_KEY and settings.SAML_SP_CERT:
        return settings.SAML_SP_KEY, settings.SAML_SP_CERT
    key, cert = ensure_keypair(settings.VAR_DIR / "saml", "sp", "Kumo SAML SP")
    return str(key), str(cert)


def current_document() -> tuple[str, str]:
    """(sha256, document) of the last good aggregate, or ("", "") before the first."""
    row = (
        FederationMetadata.objects.filter(source=settings.SAML_METADATA_URL)
        .values_list("sha256", "document")
        .first()
    )
    return row or ("", "")


def sp_config(request=None) -> SPConfig:
    """pysaml2's SP configuration (djangosaml2's ``SAML_CONFIG_LOADER``)."""
    sha, document = current_document()
    base = settings.KUMO_BASE_URL.rstrip("/")
    key = (sha, base, settings.SAML_ENTITY_ID)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    key_file, cert_file = sp_keypair()
    conf = SPConfig()
    conf.load(
        {
            "entityid": settings.SAML_ENTITY_ID or f"{base}/saml2/metadata/",
            "xmlsec_binary": settings.SAML_XMLSEC_BINARY,
            "attribute_map_dir": ATTRIBUTE_MAPS,
            "allow_unknown_attributes": True,
            "key_file": key_file,
            "cert_file": cert_file,
            "encryption_keypairs": [{"key_file": key_file, "cert_file": cert_file}],
            "accepted_time_diff": settings.SAML_ACCEPTED_TIME_DIFF_S,
            "metadata": {"inline": [document]} if document else {},
            "organization": {
                "name": [(settings.SAML_SP_NAME, "en")],
                "display_name": [(settings.SAML_SP_NAME, "en")],
                "url": [(base, "en")],
            },
            "contact_person": [
                {
                    "contact_type": "technical",
                    "email_address": settings.SAML_SP_CONTACT,
                    "given_name": "Kumo operators",
                }
            ],
            "service": {
                "sp": {
                    "name": settings.SAML_SP_NAME,
                    "endpoints": {
                        "assertion_consumer_service": [(f"{base}/saml2/acs/", BINDING_HTTP_POST)]
                    },
                    "allow_unsolicited": False,
                    "authn_requests_signed": False,
                    "want_assertions_signed": True,
                    "want_response_signed": False,
                    "name_id_format_allow_create": True,
                }
            },
        }
    )
    with _cache_lock:
        _cache.clear()  # only the current copy is worth keeping
        _cache[key] = conf
    return conf


def identity_providers(conf: SPConfig, lang: str = "en") -> list[tuple[str, str]]:
    """(entityID, display name) of every IdP in the metadata, sorted by name."""
    mds = conf.metadata
    if mds is None:
        return []
    found = []
    for entity_id in mds.identity_providers():
        name = _display_name(mds[entity_id], lang) or entity_id
        found.append((entity_id, name))
    return sorted(found, key=lambda item: item[1].casefold())


def _display_name(entity: dict, lang: str) -> str:
    for descriptor in entity.get("idpsso_descriptor", []):
        for ext in (descriptor.get("extensions") or {}).get("extension_elements", []):
            for name in ext.get("display_name", []) if isinstance(ext, dict) else []:
                if name.get("lang") == lang:
                    return name.get("text", "")
    org = entity.get("organization") or {}
    names = org.get("organization_display_name") or org.get("organization_name") or []
    for name in names:
        if name.get("lang") == lang:
            return name.get("text", "")
    return names[0].get("text", "") if names else ""


def claimed_issuer(saml_response: str) -> str:
    """The Issuer an (unverified) response names, for the audit trail of a refusal only."""
    try:
        root = ElementTree.fromstring(base64.b64decode(saml_response))
        issuer = root.find("{urn:oasis:names:tc:SAML:2.0:assertion}Issuer")
        return (issuer.text or "").strip()[:255] if issuer is not None else ""
    except Exception:
        return ""
