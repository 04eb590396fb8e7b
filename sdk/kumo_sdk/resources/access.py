"""Invitations (project admins), applications (anyone; operators and institutional
reviewers review), users and institutional reviewers (operators)."""

from __future__ import annotations

from kumo_sdk.resource import CREATE, DELETE, READ, UPDATE, Resource, missing
from kumo_sdk.types import decode
from kumo_sdk.types.access import Application, InstitutionReviewer, Invitation, OperatorUser


class Invitations(Resource[Invitation]):
    """The one way into a project (admins): ``create(email, role=...)`` invites, and the
    answer is the same for every address; ``list()`` shows each one's status;
    ``revoke(id)`` (or ``delete(id)``) revokes a pending one; ``accept(token)`` joins with
    the mail's secret, as the invitee."""

    path, type, find_by, create_args = "invitations/", Invitation, "email", ("email",)
    verbs = READ | {CREATE, DELETE}

    def revoke(self, invitation_id: int, *, project: str | None = None) -> None:
        self.delete(invitation_id, project=project)

    def accept(self, token: str) -> dict:
        return self._c.post("invitations/accept/", {"token": token})


class Applications(Resource[Application]):
    """``create(title=..., purpose=..., slug=..., gpus=..., ...)`` applies (``kind`` new,
    renewal or quota); ``update(id, ...)`` amends a returned one; ``review(id, decision,
    comment)`` for operators and institutional reviewers; ``withdraw(id)``. ``list()``
    gives your own and those you may review."""

    path, type, find_by, create_args = "applications/", Application, "title", ()
    project_scoped = False
    verbs = READ | {CREATE, UPDATE}

    def review(self, application_id: int, decision: str, comment: str = "") -> Application:
        body = {"decision": decision, "comment": comment}
        return decode(Application, self._action(application_id, "review", body))

    def withdraw(self, application_id: int) -> Application:
        return decode(Application, self._action(application_id, "withdraw"))


class Users(Resource[OperatorUser]):
    """Every user (operators): ``list(q=...)``, ``create(username, email=..., password=...)``,
    ``deactivate(username)`` (sessions and tokens end at once), ``reactivate(username)``."""

    path, type, key, find_by, create_args = (
        "admin/users/",
        OperatorUser,
        "username",
        None,
        ("username",),
    )
    project_scoped = False
    verbs = READ | {CREATE}

    def deactivate(self, username: str, reason: str = "") -> OperatorUser:
        return decode(OperatorUser, self._action(username, "deactivate", {"reason": reason}))

    def reactivate(self, username: str) -> OperatorUser:
        return decode(OperatorUser, self._action(username, "reactivate"))


class InstitutionReviewers(Resource[InstitutionReviewer]):
    """Institutional reviewers (operators): ``create(username, issuer)`` designates a user
    as the reviewer of the applicants with an identity at ``issuer`` (the IdP's entity ID or
    the OIDC issuer); ``list(user=..., issuer=...)``; ``delete(id)`` or ``remove(username,
    issuer)`` ends it."""

    path, type, find_by, create_args = (
        "admin/institution-reviewers/",
        InstitutionReviewer,
        None,
        ("user", "issuer"),
    )
    project_scoped = False
    verbs = READ | {CREATE, DELETE}
    noun = "institutional reviewer"

    def remove(self, username: str, issuer: str) -> InstitutionReviewer:
        """End ``username``'s designation for ``issuer``; the row removed (``NotFound``
        when there is none)."""
        for row in self.list(user=username, issuer=issuer):
            self.delete(row.id)
            return row
        raise missing(self._noun(), f"{username} for {issuer}", None)
