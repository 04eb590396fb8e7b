"""Institutional reviewers: who, besides operators, reviews project applications (the only
writer of ``InstitutionReviewer``).

An operator designates a user as a reviewer for an institution, named by its **issuer**:
the entity ID of its SAML identity provider, or its OIDC issuer URL. The reviewer then
reviews the applications of every applicant who has a federated identity with that issuer
(``tenants.selectors.applications_reviewable_by`` says which, for the API, the portal and
``applications.application_review`` alike). The issuer is the key because a login proves
it: the federation's signed metadata (or the OIDC provider's keys) vouch that the assertion
came from that IdP. An organisation's name is free text the IdP releases and anyone's IdP
could release any name, so it never grants anything.

Only operators designate and remove reviewers; both are audited.
"""

import re

from django.db import IntegrityError, transaction

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput, PermissionDenied
from tenants.models import InstitutionReviewer, User

#: an absolute URI (``https://idp.example.ac.jp/idp/shibboleth``, ``urn:mace:…``): what
#: entity IDs and OIDC issuers are. An organisation's name ("Example University") is not.
#: Visible ASCII only, which reads the same in Python and in the schema's ECMA regex.
ISSUER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[!-~]+$")
ISSUER_MAX = InstitutionReviewer._meta.get_field("issuer").max_length
NOT_AN_ISSUER = "an entity ID or issuer URI (https://… or urn:…), not an organisation's name"


def _operator(actor: User | None) -> None:
    if actor is None or not actor.is_staff:
        raise PermissionDenied("only operators designate and remove institutional reviewers")


def issuer_check(issuer: str) -> str:
    """``issuer`` as it is stored (stripped), or InvalidInput naming the field."""
    issuer = (issuer or "").strip()
    if not issuer:
        raise InvalidInput.field("issuer", "required: the IdP's entity ID or the OIDC issuer")
    if len(issuer) > ISSUER_MAX:
        raise InvalidInput.field("issuer", f"at most {ISSUER_MAX} characters")
    if not ISSUER.fullmatch(issuer):
        raise InvalidInput.field("issuer", NOT_AN_ISSUER)
    return issuer


@transaction.atomic
def reviewer_designate(*, user: User, issuer: str, actor: User | None) -> InstitutionReviewer:
    """Make ``user`` a reviewer of the applications of people whose identity is at
    ``issuer`` (operators). Designating the same pair twice is a conflict (409)."""
    _operator(actor)
    issuer = issuer_check(issuer)
    if not user.is_active:
        raise Conflict(f"{user.get_username()} is deactivated", details={"user": ["deactivated"]})
    try:
        with transaction.atomic():
            reviewer = InstitutionReviewer.objects.create(
                user=user, issuer=issuer, created_by=actor
            )
    except IntegrityError:
        raise Conflict(
            f"{user.get_username()} already reviews for {issuer}",
            details={"user": ["already a reviewer for this issuer"]},
        ) from None
    audit.record(
        "reviewer.designate", reviewer, detail={"user": user.get_username(), "issuer": issuer}
    )
    return reviewer


@transaction.atomic
def reviewer_remove(*, reviewer: InstitutionReviewer, actor: User | None) -> None:
    """End a designation (operators). Decisions already made stay as they were."""
    _operator(actor)
    audit.record(
        "reviewer.remove",
        reviewer,
        detail={"user": reviewer.user.get_username(), "issuer": reviewer.issuer},
    )
    reviewer.delete()
