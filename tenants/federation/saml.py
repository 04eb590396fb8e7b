"""SAML login pages: discovery, the AuthnRequest (djangosaml2's login view), the assertion
consumer service (djangosaml2's, with Kumo's mapping, replay store and refusal page), and
the SP metadata.

The attributes map as GakuNin releases them: the subject is ``SAML_SUBJECT_ATTRIBUTE``
(eduPersonPrincipalName by default); mail, displayName (else jaDisplayName), o (else jao)
and eduPersonScopedAffiliation (else eduPersonAffiliation) fill the profile.
"""

import logging
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import auth
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import IntegrityError, transaction
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from djangosaml2 import views as saml_views
from saml2.response import StatusError, UnsolicitedResponse
from saml2.sigver import SignatureError
from saml2.validate import ResponseLifetimeExceed, ToEarly

from controlplane.errors import PermissionDenied
from tenants import identities
from tenants.federation.metadata import claimed_issuer, identity_providers, sp_config
from tenants.federation.models import ConsumedAssertion
from tenants.models import ExternalIdentity

log = logging.getLogger(__name__)

REMEMBER_COOKIE = "kumo_idp"
REMEMBER_DAYS = 365


def _next(request) -> str:
    target = request.GET.get("next") or request.POST.get("next") or ""
    if url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return reverse("portal:home")


def enabled() -> bool:
    return bool(settings.SAML_METADATA_URL)


def discovery(request):
    """Pick your institution: searchable (``?q=`` without JavaScript, as you type with it),
    the last choice first."""
    if not enabled():
        return render(request, "portal/discovery.html", {"disabled": True}, status=404)
    idps = identity_providers(sp_config(request))
    query = request.GET.get("q", "").strip()
    shown = [i for i in idps if query.casefold() in (i[1] + " " + i[0]).casefold()]
    remembered = request.COOKIES.get(REMEMBER_COOKIE, "")
    remembered_idp = next((i for i in idps if i[0] == remembered), None)
    return render(
        request,
        "portal/discovery.html",
        {
            "idps": shown,
            "query": query,
            "remembered": remembered_idp,
            "next": _next(request),
            "login_url": reverse("saml2_login"),
        },
    )


class LoginView(saml_views.LoginView):
    """Sends the AuthnRequest to the chosen IdP; with none chosen, the discovery page."""

    def get(self, request, *args, **kwargs):
        if not enabled():
            return refusal(request, "SAML login is not configured on this cloud.", status=404)
        idp = request.GET.get("idp", "")
        if not idp:
            query = urlencode({"next": _next(request)})
            return HttpResponseRedirect(f"{reverse('portal:discovery')}?{query}")
        response = super().get(request, *args, **kwargs)
        if response.status_code in (200, 302, 303):
            response.set_cookie(
                REMEMBER_COOKIE,
                idp,
                max_age=REMEMBER_DAYS * 86400,
                httponly=True,
                samesite="Lax",
                secure=settings.SESSION_COOKIE_SECURE,
            )
        return response

    def unknown_idp(self, request, idp):
        return refusal(request, "That institution is not in the federation's metadata.", 404)


def _reason(exception) -> str:
    if isinstance(exception, SignatureError):
        return "The response's signature does not verify with the institution's certificate."
    if isinstance(exception, ResponseLifetimeExceed | ToEarly):
        return "The assertion is outside its validity period (expired, or not yet valid)."
    if isinstance(exception, UnsolicitedResponse):
        return "The response answers no login started here: it was replayed or unsolicited."
    if isinstance(exception, StatusError):
        return "Your institution did not log you in."
    if isinstance(exception, _Replayed):
        return "This assertion was already used: it was replayed."
    text = str(exception)
    if "AudienceRestrictions" in text:
        return "The assertion was issued for another service, not for this cloud."
    if isinstance(exception, PermissionDenied | DjangoPermissionDenied):
        return text or "The login was refused."
    return "The response could not be verified."


class _Replayed(Exception):
    pass


class AssertionConsumerServiceView(saml_views.AssertionConsumerServiceView):
    """Verifies the IdP's response (pysaml2: signature, audience, validity, InResponseTo),
    refuses an assertion id already consumed, and logs the person in through
    ``tenants.identities.federated_login``. Every refusal is audited and shown on a page
    that says why."""

    def custom_validation(self, response):
        assertion = response.assertion
        issuer = response.issuer() or ""
        end = None
        for confirmation in assertion.subject.subject_confirmation:
            data = confirmation.subject_confirmation_data
            if data is not None and data.not_on_or_after:
                end = data.not_on_or_after
        if assertion.conditions is not None and assertion.conditions.not_on_or_after:
            end = end or assertion.conditions.not_on_or_after
        until = (
            datetime.strptime(end, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            if end
            else timezone.now()
        )
        ConsumedAssertion.objects.filter(not_on_or_after__lt=timezone.now()).delete()
        try:
            with transaction.atomic():
                ConsumedAssertion.objects.create(
                    issuer=issuer[:255], assertion_id=assertion.id[:255], not_on_or_after=until
                )
        except IntegrityError:
            self._refused_because = _Replayed()
            raise _Replayed() from None

    def post(self, request, *args, **kwargs):
        self._refused_because = None
        return super().post(request, *args, **kwargs)

    def handle_acs_failure(self, request, exception=None, status=403, **kwargs):
        exception = getattr(self, "_refused_because", None) or exception
        reason = _reason(exception)
        log.info("SAML login refused: %s (%r)", reason, exception)
        identities.federated_login_refused(
            kind=ExternalIdentity.Kind.SAML,
            issuer=claimed_issuer(request.POST.get("SAMLResponse", "")),
            reason=reason,
            detail={"error": type(exception).__name__},
        )
        return refusal(request, reason, status=403)

    def authenticate_user(self, request, session_info, attribute_mapping, create_unknown_user, ai):
        try:
            user = identities.federated_login(profile=profile_from(session_info))
        except PermissionDenied as e:
            raise DjangoPermissionDenied(str(e)) from None
        auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        saml_views._set_subject_id(request.saml_session, session_info["name_id"])
        return user


def _first(ava: dict, *names: str) -> str:
    for name in names:
        values = ava.get(name) or []
        if values and str(values[0]).strip():
            return str(values[0]).strip()
    return ""


def profile_from(session_info: dict) -> identities.FederatedProfile:
    """Kumo's profile from pysaml2's session info (attribute values by friendly name)."""
    ava = session_info.get("ava") or {}
    wanted = settings.SAML_SUBJECT_ATTRIBUTE
    if wanted == "name_id":
        name_id = session_info.get("name_id")
        persistent = "urn:oasis:names:tc:SAML:2.0:nameid-format:persistent"
        subject = name_id.text if name_id is not None and name_id.format == persistent else ""
    else:
        subject = _first(ava, wanted)
    affiliation = ava.get("eduPersonScopedAffiliation") or ava.get("eduPersonAffiliation") or []
    return identities.FederatedProfile(
        kind=ExternalIdentity.Kind.SAML,
        issuer=session_info.get("issuer", ""),
        subject=subject,
        email=_first(ava, "mail", "email"),
        display_name=_first(ava, "displayName", "jaDisplayName"),
        organisation=_first(ava, "o", "jao"),
        affiliation=",".join(str(a) for a in affiliation),
        attributes={k: [str(v) for v in vs] for k, vs in ava.items()},
    )


def refusal(request, reason: str, status: int = 403):
    return render(request, "portal/login_refused.html", {"reason": reason}, status=status)


class MetadataView(saml_views.MetadataView):
    """The SP's own metadata, to register with the federation."""
