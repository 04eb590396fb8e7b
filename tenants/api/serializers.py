from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from controlplane.api import fields
from tenants.choices import ProjectStatus, Role
from tenants.models import (
    ApiToken,
    ExternalIdentity,
    Membership,
    Project,
    Quota,
    SSHKey,
    User,
    slug_validator,
)


class UserBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = User
        fields = ["username", "email", "first_name", "last_name"]
        read_only_fields = fields


class IdentitySerializer(serializers.ModelSerializer):
    """A federated identity (SAML or OIDC) linked to a user: who vouches (``issuer``) for
    whom (``subject``)."""

    class Meta:
        model = ExternalIdentity
        fields = ["id", "kind", "issuer", "subject", "last_login_at", "created_at"]
        read_only_fields = fields


class MeSerializer(serializers.ModelSerializer):
    """The caller, with the profile their institution released and their linked identities."""

    identities = IdentitySerializer(source="external_identities", many=True, read_only=True)

    class Meta:
        model = User
        fields = [
            "id", "username", "email", "first_name", "last_name", "display_name",
            "organisation", "affiliation", "is_staff", "date_joined", "identities",
        ]  # fmt: skip
        read_only_fields = fields


class ProjectSerializer(fields.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(
        view_name="api:project-detail", lookup_field="slug", lookup_url_kwarg="project_slug"
    )
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    my_role = serializers.SerializerMethodField()

    class Meta:
        model = Project
        fields = [
            "url",
            "slug",
            "name",
            "description",
            "owner",
            "status",
            "valid_from",
            "valid_until",
            "my_role",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["owner", "status", "created_at", "updated_at"]
        # Uniqueness is the service's 409; the format is checked here with the other fields.
        extra_kwargs = {"slug": {"validators": [slug_validator]}}

    @extend_schema_field(serializers.ChoiceField(choices=Role.choices, allow_null=True))
    def get_my_role(self, project) -> str | None:
        return getattr(project, "my_role", None)

    def validate(self, attrs):
        start = attrs.get("valid_from", getattr(self.instance, "valid_from", None))
        end = attrs.get("valid_until", getattr(self.instance, "valid_until", None))
        if start and end and end < start:
            raise serializers.ValidationError({"valid_until": "must not be before valid_from"})
        return attrs


class ProjectUpdateSerializer(ProjectSerializer):
    class Meta(ProjectSerializer.Meta):
        read_only_fields = [*ProjectSerializer.Meta.read_only_fields, "slug"]


class OperatorProjectSerializer(ProjectSerializer):
    """What operators see and set: also the owner (at create) and the status."""

    url = serializers.HyperlinkedIdentityField(
        view_name="api:admin-project-detail", lookup_field="slug"
    )
    owner = fields.SlugRelatedField(slug_field="username", queryset=User.objects.all())
    status = serializers.ChoiceField(choices=ProjectStatus.choices, required=False)

    class Meta(ProjectSerializer.Meta):
        fields = [f for f in ProjectSerializer.Meta.fields if f != "my_role"]
        read_only_fields = ["created_at", "updated_at"]


class OperatorProjectUpdateSerializer(OperatorProjectSerializer):
    """A project keeps its slug, and changes owners through the members endpoint."""

    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta(OperatorProjectSerializer.Meta):
        read_only_fields = [*OperatorProjectSerializer.Meta.read_only_fields, "slug"]


class MembershipSerializer(serializers.ModelSerializer):
    user = UserBriefSerializer(read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "role", "created_at"]
        read_only_fields = ["id", "user", "created_at"]


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class QuotaLineSerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    used = serializers.IntegerField()
    available = serializers.IntegerField()


@extend_schema_serializer(many=False)  # also where a list action answers it (quota)
class QuotaReportSerializer(serializers.Serializer):
    """Per resource: limit, what is used now (counted from what exists), what is left."""

    vcpus = QuotaLineSerializer()
    memory_gib = QuotaLineSerializer()
    gpus = QuotaLineSerializer()
    vms = QuotaLineSerializer()
    networks = QuotaLineSerializer()
    global_ips = QuotaLineSerializer()
    storage_gib = QuotaLineSerializer()
    buckets = QuotaLineSerializer()


class QuotaLimitsSerializer(serializers.ModelSerializer):
    class Meta:
        model = Quota
        fields = list(Quota.RESOURCES)
        extra_kwargs = {
            name: {"required": False, "max_value": 2**31 - 1} for name in Quota.RESOURCES
        }


class SSHKeySerializer(fields.ModelSerializer):
    class Meta:
        model = SSHKey
        fields = [
            "id",
            "name",
            "public_key",
            "key_type",
            "bits",
            "fingerprint",
            "comment",
            "created_at",
        ]
        read_only_fields = ["id", "key_type", "bits", "fingerprint", "comment", "created_at"]
        extra_kwargs = {
            "name": {"required": False, "allow_blank": True},
            "public_key": {"max_length": 16 * 1024},
        }
        validators = []  # uniqueness is the service's 409


class ApiTokenSerializer(fields.ModelSerializer):
    project = fields.SlugRelatedField(
        slug_field="slug", queryset=Project.objects.none(), required=False, allow_null=True
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "project",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "created_at",
        ]
        read_only_fields = ["id", "prefix", "last_used_at", "revoked_at", "created_at"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None and request.user.is_authenticated:
            # A token can only be scoped to a project its user belongs to; any other slug
            # reads as missing.
            self.fields["project"].queryset = Project.objects.visible_to(request.user)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="the secret: shown once, never again")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class LoginSerializer(serializers.Serializer):
    username = fields.CharField(max_length=150)
    password = fields.CharField(max_length=4096, style={"input_type": "password"})
    otp = fields.CharField(
        max_length=20,
        required=False,
        help_text="TOTP or recovery code: required when the account has a second factor",
    )
