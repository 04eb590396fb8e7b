"""How people get into projects: invitations (by e-mail, accepted after login) and project
applications (apply, review, approve into a project; renewals and quota increases too), and
who besides operators reviews them (institutional reviewers).
Imported by ``tenants.models`` (the package), so Django finds these models in the ``tenants``
app."""

from django.db import models

from tenants.choices import Role
from tenants.models.core import Project, ProjectOwnedModel, User


class Invitation(ProjectOwnedModel):
    """An invitation to ``email`` to join ``project`` with ``role``. Only the SHA-256 of its
    secret is kept; the secret travels in the e-mail's link. Whether an account with that
    address exists is never looked at when inviting."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ACCEPTED = "accepted", "Accepted"
        REVOKED = "revoked", "Revoked"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    digest = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    invited_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    accepted_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        # No address here: this is what the project's audit trail shows to all its members.
        return f"invitation {self.pk} ({self.role})"


class ProjectApplication(models.Model):
    """An application: for a new project, a renewal of one, or a quota increase.

    ``submitted → (returned → submitted)* → approved | rejected``, or ``withdrawn`` by the
    applicant. Approving a new-project application creates the project with the quota asked
    and the applicant as its owner; a renewal moves ``valid_until``; a quota increase sets
    the quota. Every transition is a row update guarded by the current state."""

    class Kind(models.TextChoices):
        NEW = "new", "New project"
        RENEWAL = "renewal", "Renewal"
        QUOTA = "quota", "Quota increase"

    class State(models.TextChoices):
        SUBMITTED = "submitted", "Submitted"
        RETURNED = "returned", "Returned for changes"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        WITHDRAWN = "withdrawn", "Withdrawn"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.NEW)
    state = models.CharField(max_length=16, choices=State.choices, default=State.SUBMITTED)
    applicant = models.ForeignKey(User, on_delete=models.PROTECT, related_name="applications")
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="applications"
    )
    slug = models.SlugField(max_length=40, blank=True)
    title = models.CharField(max_length=200)
    purpose = models.TextField()
    field = models.CharField(max_length=200, blank=True)
    vcpus = models.PositiveIntegerField(default=0)
    memory_gib = models.PositiveIntegerField(default=0)
    gpus = models.PositiveIntegerField(default=0)
    storage_gib = models.PositiveIntegerField(default=0)
    global_ips = models.PositiveIntegerField(default=0)
    valid_from = models.DateField(null=True, blank=True)
    valid_until = models.DateField(null=True, blank=True)
    review_comment = models.TextField(blank=True)
    reviewed_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    generation = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    RESOURCES = ("vcpus", "memory_gib", "gpus", "storage_gib", "global_ips")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.get_kind_display()}: {self.title}"


class RenewalReminder(models.Model):
    """A reminder sent to a project's owners ``days_before`` its ``valid_until``: one row
    per (project, end date, days), so each reminder goes out once."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    valid_until = models.DateField()
    days_before = models.PositiveSmallIntegerField()
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "valid_until", "days_before"], name="unique_renewal_reminder"
            )
        ]

    def __str__(self):
        return f"reminder {self.days_before} days before {self.valid_until}"


class InstitutionReviewer(models.Model):
    """``user`` reviews the applications of people of one institution, named by ``issuer``:
    the entity ID of its SAML identity provider, or its OIDC issuer. An applicant is of that
    institution when they have an ``ExternalIdentity`` with that issuer. The issuer is the
    key because it is what a verified login proves; an organisation's name is free text the
    IdP releases, and two institutions (or one IdP misconfigured) may release the same."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="reviews_for")
    issuer = models.CharField(max_length=255)
    created_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["issuer", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "issuer"], name="unique_institution_reviewer")
        ]

    def __str__(self):
        return f"{self.user} reviews for {self.issuer}"
