"""Project applications and their review (mdx's application portal, ColdFront's
allocations); renewal reminders.

An application is for a new project, a renewal (a later ``valid_until``) or a quota
increase. ``submitted`` goes to ``approved``, ``rejected`` or ``returned`` (with the
reviewer's comments); a returned one is amended and is ``submitted`` again. Approving a new
project creates it with the quota asked and the applicant as owner; a renewal moves its end
(and reactivates an expired project); a quota increase sets the limits asked. Operators
review every application; an institutional reviewer (``tenants.reviewers``) those of
applicants who have an identity at their institution's IdP; nobody reviews their own. Each
step is audited (with the authority it was decided on) and tells the applicant by mail;
steps on an existing project are also project events (webhooks, and mail to its admins).

Each transition is guarded twice: the state is checked under a row lock and the UPDATE
matches the generation read, so two reviewers racing cannot both decide.
"""

from datetime import date, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import audit, events
from controlplane.errors import Conflict, InvalidInput, PermissionDenied
from tenants import selectors, services
from tenants.choices import ProjectStatus, Role
from tenants.models import (
    ExternalIdentity,
    InstitutionReviewer,
    Project,
    ProjectApplication,
    RenewalReminder,
    User,
    slug_validator,
)

State, Kind = ProjectApplication.State, ProjectApplication.Kind
_EDITABLE = (
    "title",
    "purpose",
    "field",
    "slug",
    "valid_from",
    "valid_until",
    *ProjectApplication.RESOURCES,
)
REMINDER_DAYS = (30, 7)


def _tell_applicant(application: ProjectApplication, subject: str, text: str) -> None:
    email = application.applicant.email
    if not email:
        return
    transaction.on_commit(
        lambda: send_mail(
            subject=f"[Kumo] {subject}",
            message=text,
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=[email],
            fail_silently=True,
        ),
        robust=True,
    )


def _check(application: ProjectApplication) -> None:
    if not application.title.strip():
        raise InvalidInput.field("title", "required")
    if not application.purpose.strip():
        raise InvalidInput.field("purpose", "required: say what the project will do")
    start, end = application.valid_from, application.valid_until
    if start and end and end < start:
        raise InvalidInput.field("valid_until", "must not be before valid_from")
    if application.kind == Kind.NEW:
        try:
            slug_validator(application.slug)
        except ValidationError as e:
            raise InvalidInput.field("slug", e.messages[0]) from None
        if Project.objects.filter(slug=application.slug).exists():
            raise Conflict(f"a project {application.slug!r} exists", details={"slug": ["taken"]})
    elif application.kind == Kind.RENEWAL:
        if not application.valid_until:
            raise InvalidInput.field("valid_until", "required: the new end of the project")
        current = application.project.valid_until if application.project else None
        if current and application.valid_until <= current:
            raise InvalidInput.field(
                "valid_until", f"must be after the project's current end, {current}"
            )
    elif application.kind == Kind.QUOTA and not any(
        getattr(application, r) for r in ProjectApplication.RESOURCES
    ):
        raise InvalidInput.field("vcpus", "ask for at least one resource")


@transaction.atomic
def application_submit(
    *, applicant: User, kind: str = Kind.NEW, project: Project | None = None, **fields
) -> ProjectApplication:
    """Apply. A renewal or quota increase names a project the applicant administers."""
    if kind not in Kind.values:
        raise InvalidInput.field("kind", f"must be one of {', '.join(Kind.values)}")
    unknown = set(fields) - set(_EDITABLE)
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "unknown field")
    if kind != Kind.NEW:
        if project is None:
            raise InvalidInput.field("project", "required for a renewal or a quota increase")
        if not Role.at_least(services.role_of(applicant, project), Role.ADMIN):
            raise PermissionDenied("only the project's owners and admins apply for it")
        fields.setdefault("slug", project.slug)
    application = ProjectApplication(applicant=applicant, kind=kind, project=project, **fields)
    _check(application)
    application.save()
    audit.record("application.submit", application, project=project, detail={"kind": kind})
    if project is not None:
        events.emit(
            "application.submitted",
            project=project,
            obj=application,
            message=f"{applicant.get_username()} applied: {application}",
        )
    return application


@transaction.atomic
def application_amend(
    *, application: ProjectApplication, actor: User, **changes
) -> ProjectApplication:
    """Change a returned application and submit it again (its applicant only)."""
    unknown = set(changes) - set(_EDITABLE)
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "cannot be changed")
    application = ProjectApplication.objects.select_for_update().get(pk=application.pk)
    if application.applicant_id != actor.pk:
        raise PermissionDenied("only the applicant amends an application")
    if application.state != State.RETURNED:
        raise Conflict(
            f"the application is {application.state}; only a returned one is amended",
            details={"state": [application.state]},
        )
    for name, value in changes.items():
        setattr(application, name, value)
    _check(application)
    application.state = State.SUBMITTED
    _save_guarded(application, [*changes, "state"])
    audit.record(
        "application.amend", application, project=application.project, detail=sorted(changes)
    )
    return application


def _save_guarded(application: ProjectApplication, fields: list[str]) -> None:
    generation = application.generation
    application.generation = generation + 1
    values = {f: getattr(application, f) for f in fields}
    updated = ProjectApplication.objects.filter(pk=application.pk, generation=generation).update(
        generation=generation + 1, updated_at=timezone.now(), **values
    )
    if not updated:
        raise Conflict("the application changed meanwhile; reload it")


DECISIONS = ("approve", "return", "reject")


@transaction.atomic
def application_review(
    *, application: ProjectApplication, reviewer: User, decision: str, comment: str = ""
) -> ProjectApplication:
    """Approve, return for changes (a comment is required) or reject: operators, or a
    reviewer of an institution the applicant has an identity at; never the applicant
    (``selectors.applications_reviewable_by``). Refused with 403 saying why."""
    authority = _review_authority(reviewer, application)
    if decision not in DECISIONS:
        raise InvalidInput.field("decision", f"must be one of {', '.join(DECISIONS)}")
    if decision == "return" and not comment.strip():
        raise InvalidInput.field("comment", "say what to change")
    application = ProjectApplication.objects.select_for_update().get(pk=application.pk)
    if application.state != State.SUBMITTED:
        raise Conflict(
            f"the application is {application.state}", details={"state": [application.state]}
        )
    application.state = {
        "approve": State.APPROVED,
        "return": State.RETURNED,
        "reject": State.REJECTED,
    }[decision]
    application.review_comment, application.reviewed_by = comment, reviewer
    if decision == "approve":
        _carry_out(application)
    _save_guarded(application, ["state", "review_comment", "reviewed_by", "project"])
    audit.record(
        f"application.{decision}",
        application,
        project=application.project,
        detail={"kind": application.kind, "comment": comment[:500], "as": authority},
    )
    _tell_applicant(
        application,
        f"your application {application.title!r} is {application.state}",
        f"Your application {application.title!r} ({application.get_kind_display()}) is "
        f"{application.get_state_display().lower()}.\n\n{comment}",
    )
    if application.project is not None:
        events.emit(
            f"application.{application.state}",
            project=application.project,
            obj=application,
            message=f"{application} {application.state}",
            mail=True,
        )
    return application


def _review_authority(reviewer: User, application: ProjectApplication) -> str:
    """On what authority ``reviewer`` decides on ``application`` ("operator", or the issuers
    they review for that the applicant has an identity at), or PermissionDenied saying why
    they may not."""
    if application.applicant_id == reviewer.pk:
        raise PermissionDenied("you cannot review your own application")
    if not selectors.applications_reviewable_by(reviewer).filter(pk=application.pk).exists():
        mine = sorted(
            InstitutionReviewer.objects.filter(user=reviewer).values_list("issuer", flat=True)
        )
        if not mine:
            raise PermissionDenied(
                "applications are reviewed by operators and institutional reviewers; "
                "you are neither"
            )
        if not ExternalIdentity.objects.filter(user_id=application.applicant_id).exists():
            raise PermissionDenied(
                "the applicant has no federated identity, so no institution vouches for them: "
                "only operators review this application"
            )
        raise PermissionDenied(
            f"you review applications of people of {', '.join(mine)}; the applicant has no "
            "identity there"
        )
    if reviewer.is_staff:
        return "operator"
    issuers = ExternalIdentity.objects.filter(
        user_id=application.applicant_id,
        issuer__in=InstitutionReviewer.objects.filter(user=reviewer).values("issuer"),
    ).values_list("issuer", flat=True)
    return "reviewer of " + ", ".join(sorted(set(issuers)))


def _carry_out(application: ProjectApplication) -> None:
    asked = {r: getattr(application, r) for r in ProjectApplication.RESOURCES}
    if application.kind == Kind.NEW:
        application.project = services.project_create(
            slug=application.slug,
            name=application.title,
            owner=application.applicant,
            description=application.purpose,
            valid_from=application.valid_from,
            valid_until=application.valid_until,
            quota=asked,
        )
    elif application.kind == Kind.RENEWAL:
        project = services.project_update(
            project=application.project, valid_until=application.valid_until
        )
        if project.status == ProjectStatus.EXPIRED:
            services.project_set_status(
                project=project, status=ProjectStatus.ACTIVE, reason="renewed"
            )
    else:
        services.quota_set(project=application.project, **{k: v for k, v in asked.items() if v})


@transaction.atomic
def application_withdraw(*, application: ProjectApplication, actor: User) -> ProjectApplication:
    application = ProjectApplication.objects.select_for_update().get(pk=application.pk)
    if application.applicant_id != actor.pk:
        raise PermissionDenied("only the applicant withdraws an application")
    if application.state not in (State.SUBMITTED, State.RETURNED):
        raise Conflict(f"the application is {application.state}")
    application.state = State.WITHDRAWN
    _save_guarded(application, ["state"])
    audit.record("application.withdraw", application, project=application.project)
    return application


def renewal_reminders_send(*, today: date | None = None) -> list[tuple[str, int]]:
    """Remind the owners of every active project whose ``valid_until`` is 30 (then 7) days
    or less ahead; each reminder goes once per project and end date (beat, daily)."""
    today = today or timezone.localdate()
    sent = []
    horizon = today + timedelta(days=max(REMINDER_DAYS))
    due = Project.objects.filter(
        status=ProjectStatus.ACTIVE, valid_until__gte=today, valid_until__lte=horizon
    )
    for project in due:
        days_left = (project.valid_until - today).days
        days = min(d for d in REMINDER_DAYS if days_left <= d)
        try:
            with transaction.atomic():
                RenewalReminder.objects.create(
                    project=project, valid_until=project.valid_until, days_before=days
                )
                events.emit(
                    "project.renewal_reminder",
                    project=project,
                    obj=project,
                    message=(
                        f"{project.slug} ends on {project.valid_until} ({days_left} days): "
                        "apply for a renewal to keep it."
                    ),
                    payload={"valid_until": str(project.valid_until), "days_left": days_left},
                    mail=True,
                )
                audit.record(
                    "project.renewal_reminder", project, project=project, detail={"days": days}
                )
        except IntegrityError:
            continue  # this one went out already
        sent.append((project.slug, days))
    return sent
