"""Users, projects (Kumo's tenants), memberships, quotas, SSH keys and API tokens."""

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from controlplane.querysets import ProjectOwnedQuerySet
from tenants.choices import ProjectStatus, Role, SSHKeyType

slug_validator = RegexValidator(
    r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$",
    "3 to 40 characters: lower-case letters, digits and hyphens, starting with a letter "
    "and not ending with a hyphen.",
)


class User(AbstractUser):
    """A person. Login by password now; federated identities attach through ExternalIdentity."""

    email = models.EmailField("email address", blank=True, db_index=True)


class ExternalIdentity(models.Model):
    """A federated login (SAML/OIDC, e.g. GakuNin) bound to a user: issuer + subject."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="external_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="unique_external_identity")
        ]
        verbose_name_plural = "external identities"

    def __str__(self):
        return f"{self.issuer}#{self.subject}"


class ProjectQuerySet(models.QuerySet):
    def visible_to(self, user, *, token=None):
        """Projects where ``user`` holds a role; with a project-scoped token, only that one."""
        if not user.is_authenticated:
            return self.none()
        qs = self.filter(memberships__user=user)
        if token is not None and token.project_id is not None:
            qs = qs.filter(pk=token.project_id)
        return qs


class Project(models.Model):
    """A tenant: one research project. Everything a tenant owns points here."""

    slug = models.SlugField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(User, on_delete=models.PROTECT, related_name="owned_projects")
    status = models.CharField(
        max_length=16, choices=ProjectStatus.choices, default=ProjectStatus.ACTIVE
    )
    valid_from = models.DateField(null=True, blank=True)
    valid_until = models.DateField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(valid_until__isnull=True)
                | Q(valid_from__isnull=True)
                | Q(valid_until__gte=models.F("valid_from")),
                name="project_validity_ordered",
            )
        ]

    def __str__(self):
        return self.slug


class ProjectOwnedModel(models.Model):
    """Base of every tenant-owned model: it knows its project, and reads go through
    ``Model.objects.for_project(project)``, the scoped queryset the API's base viewset uses."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")

    objects = ProjectOwnedQuerySet.as_manager()

    class Meta:
        abstract = True


class Membership(ProjectOwnedModel):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="unique_membership")
        ]

    def __str__(self):
        return f"{self.user} in {self.project} ({self.role})"


class Quota(models.Model):
    """Limits of one project. Usage is never stored here: it is counted from what exists
    (``tenants.quotas.usage``), so it cannot drift."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="quota")
    vcpus = models.PositiveIntegerField(validators=[MinValueValidator(0)])
    memory_gib = models.PositiveIntegerField()
    gpus = models.PositiveIntegerField()
    vms = models.PositiveIntegerField()
    networks = models.PositiveIntegerField()
    global_ips = models.PositiveIntegerField()
    storage_gib = models.PositiveIntegerField()
    buckets = models.PositiveIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    RESOURCES = (
        "vcpus",
        "memory_gib",
        "gpus",
        "vms",
        "networks",
        "global_ips",
        "storage_gib",
        "buckets",
    )

    def __str__(self):
        return f"quota of {self.project}"

    def limits(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.RESOURCES}


class SSHKey(models.Model):
    """An SSH public key of a user, parsed and validated on the way in."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    key_type = models.CharField(max_length=32, choices=SSHKeyType.choices)
    bits = models.PositiveIntegerField()
    fingerprint = models.CharField(max_length=64, help_text="SHA256:… as ssh-keygen -l shows it")
    comment = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "fingerprint"], name="unique_user_key"),
            models.UniqueConstraint(fields=["user", "name"], name="unique_user_key_name"),
        ]
        verbose_name = "SSH key"

    def __str__(self):
        return f"{self.name} ({self.fingerprint})"


class ApiToken(models.Model):
    """A bearer token for the API. Only its SHA-256 is stored; the secret is shown once.

    ``prefix`` is the public part of the token (``kumo_<prefix>_<secret>``) and finds the row
    without a scan. A token scoped to a project sees that project alone.
    """

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


def default_quota() -> dict[str, int]:
    return dict(settings.DEFAULT_QUOTA)
