"""OpenID Connect login (authlib's Django client): authorization code with PKCE (S256),
any number of providers from ``KUMO_OIDC_PROVIDERS``.

authlib keeps ``state``, ``nonce`` and the PKCE verifier in the session; the callback
refuses a ``state`` it did not issue, and the ID token must verify against the provider's
JWKS with the expected issuer, audience, lifetime and ``nonce``. The person is then found
by (issuer, ``subject_claim``) through ``tenants.identities.federated_login``, exactly as a
SAML login is.
"""

import json
import logging
import threading

from authlib.integrations.base_client import OAuthError
from authlib.integrations.django_client import OAuth
from django.conf import settings
from django.contrib import auth
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from joserfc.errors import JoseError

from controlplane.errors import PermissionDenied
from tenants import identities
from tenants.federation.saml import _next, refusal
from tenants.models import ExternalIdentity

log = logging.getLogger(__name__)

_registry: dict = {}
_lock = threading.Lock()


def providers() -> dict[str, dict]:
    return {p["name"]: p for p in settings.OIDC_PROVIDERS}


def _client(name: str):
    """authlib's client for provider ``name`` (404 for an unknown one)."""
    config = providers().get(name)
    if config is None:
        raise Http404("no such provider")
    key = json.dumps(settings.OIDC_PROVIDERS, sort_keys=True)
    with _lock:
        if key not in _registry:
            oauth = OAuth()
            for p in settings.OIDC_PROVIDERS:
                oauth.register(
                    name=p["name"],
                    client_id=p["client_id"],
                    client_secret=p.get("client_secret", ""),
                    server_metadata_url=p["issuer"].rstrip("/")
                    + "/.well-known/openid-configuration",
                    client_kwargs={
                        "scope": p.get("scopes", "openid email profile"),
                        "code_challenge_method": "S256",
                    },
                )
            _registry.clear()
            _registry[key] = oauth
        return _registry[key].create_client(name)


def redirect_uri(name: str) -> str:
    return settings.KUMO_BASE_URL.rstrip("/") + reverse("oidc-callback", args=[name])


def login(request, name: str):
    """Send the browser to the provider with state, nonce and a PKCE challenge."""
    client = _client(name)
    request.session["oidc_next"] = _next(request)
    return client.authorize_redirect(request, redirect_uri(name))


def callback(request, name: str):
    """The provider's answer: checked, then the person is logged in (or refused, audited)."""
    config = providers().get(name) or {}
    client = _client(name)
    try:
        token = client.authorize_access_token(request)
        claims = token.get("userinfo")
        if not claims:
            raise OAuthError(description="the provider sent no ID token")
    except (OAuthError, JoseError, ValueError, KeyError) as e:
        reason = _reason(e)
        identities.federated_login_refused(
            kind=ExternalIdentity.Kind.OIDC,
            issuer=config.get("issuer", name),
            reason=reason,
            detail={"provider": name, "error": type(e).__name__, "message": str(e)[:300]},
        )
        return refusal(request, reason)
    subject_claim = config.get("subject_claim", "sub")
    affiliation = claims.get("eduperson_scoped_affiliation") or claims.get("affiliation") or []
    if isinstance(affiliation, str):
        affiliation = [affiliation]
    profile = identities.FederatedProfile(
        kind=ExternalIdentity.Kind.OIDC,
        issuer=claims.get("iss", ""),
        subject=str(claims.get(subject_claim, "")),
        email=claims.get("email", "") if claims.get("email_verified", True) else "",
        display_name=claims.get("name", ""),
        organisation=claims.get("organization", "") or claims.get("o", ""),
        affiliation=",".join(affiliation),
        attributes={k: v for k, v in claims.items() if k not in ("nonce", "at_hash")},
    )
    try:
        user = identities.federated_login(profile=profile)
    except PermissionDenied as e:
        return refusal(request, str(e))
    auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return HttpResponseRedirect(request.session.pop("oidc_next", None) or reverse("portal:home"))


def _reason(error) -> str:
    text = str(error)
    if "state" in text.lower() or type(error).__name__ == "MismatchingStateError":
        return "The answer does not belong to a login started here (wrong state)."
    if "nonce" in text.lower():
        return "The ID token was not issued for this login (wrong nonce)."
    if isinstance(error, JoseError):
        return "The ID token does not verify (signature, issuer, audience or lifetime)."
    return f"The provider did not log you in: {text[:200]}"
