"""What federated login keeps: the federation's last good metadata, and the assertions
already consumed (so a replayed one is refused)."""

from django.db import models


class FederationMetadata(models.Model):
    """The federation's metadata aggregate as last fetched and checked (one row per source).

    ``document`` is the last copy whose signature verified against the federation's
    certificate; a failed refresh writes ``last_error`` and ``last_failure_at`` and leaves
    ``document`` as it was, so logins go on with the last good copy. Every web process reads
    it from here (no file to share between replicas)."""

    source = models.CharField(max_length=500, unique=True)
    document = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    idp_count = models.PositiveIntegerField(default=0)
    valid_until = models.DateTimeField(null=True, blank=True)
    fetched_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        verbose_name_plural = "federation metadata"

    def __str__(self):
        return self.source


class ConsumedAssertion(models.Model):
    """A SAML assertion id seen once. A second response carrying it is a replay; rows are
    purged once the assertion's own validity has ended (it could not be accepted then)."""

    issuer = models.CharField(max_length=255)
    assertion_id = models.CharField(max_length=255)
    not_on_or_after = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["issuer", "assertion_id"], name="unique_consumed_assertion"
            )
        ]

    def __str__(self):
        return f"{self.issuer}#{self.assertion_id}"
