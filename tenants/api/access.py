"""Invitations and project applications in the API.

- ``projects/{slug}/invitations/``: admins invite by e-mail, list and revoke. The answer to
  an invitation is the same whether or not anyone has that address.
- ``invitations/accept/``: the logged-in invitee accepts with the secret from the e-mail.
- ``applications/``: anyone applies and sees their own applications; operators review
  every application, institutional reviewers those of their institutions' applicants (and
  see those too); nobody reviews their own.
- ``admin/institution-reviewers/``: operators designate and remove institutional reviewers.
"""

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api import fields
from controlplane.api.errors import ErrorSerializer
from controlplane.api.viewsets import KumoViewMixin, OperatorViewSet, ProjectScopedViewSet
from tenants import applications, invitations, reviewers, selectors, services, users
from tenants.api.serializers import IdentitySerializer
from tenants.choices import Role
from tenants.filtersets import InstitutionReviewerFilterSet
from tenants.models import (
    InstitutionReviewer,
    Invitation,
    Project,
    ProjectApplication,
    User,
)


class InvitationSerializer(fields.ModelSerializer):
    status = serializers.SerializerMethodField()
    invited_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "status", "invited_by", "expires_at", "created_at"]
        read_only_fields = ["id", "status", "invited_by", "expires_at", "created_at"]

    def get_status(self, obj) -> str:
        return invitations.invitation_status(obj)


class InvitationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """A project's invitations (admins). DELETE revokes a pending one."""

    model = Invitation
    serializer_class = InvitationSerializer
    lookup_value_regex = r"[0-9]+"
    read_role = Role.ADMIN
    write_role = Role.ADMIN
    audit_object_type = "tenants.invitation"

    def get_queryset(self):
        return super().get_queryset().select_related("invited_by")

    def perform_create(self, serializer):
        invitation, _secret = invitations.invitation_create(
            project=self.project, actor=self.request.user, **serializer.validated_data
        )
        serializer.instance = invitation

    def perform_destroy(self, instance):
        invitations.invitation_revoke(invitation=instance)


class InvitationAcceptView(KumoViewMixin, APIView):
    """Accept an invitation (the secret from its e-mail) as the logged-in user."""

    @extend_schema(
        request=inline_serializer("InvitationAccept", {"token": serializers.CharField()}),
        responses={
            200: inline_serializer(
                "InvitationAccepted",
                {"project": serializers.CharField(), "role": serializers.CharField()},
            ),
            400: ErrorSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
    )
    def post(self, request):
        token = request.data.get("token") if isinstance(request.data, dict) else None
        if not token or not isinstance(token, str):
            raise serializers.ValidationError({"token": ["required"]})
        membership = invitations.invitation_accept(secret=token, user=request.user)
        return Response(
            {"project": membership.project.slug, "role": membership.role},
            status=status.HTTP_200_OK,
        )


# --- applications -------------------------------------------------------------------------------


class ApplicationSerializer(fields.ModelSerializer):
    applicant = serializers.SlugRelatedField(slug_field="username", read_only=True)
    reviewed_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    project = fields.SlugRelatedField(  # NUL refused, not looked up
        slug_field="slug", queryset=Project.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = ProjectApplication
        fields = [
            "id",
            "kind",
            "state",
            "applicant",
            "project",
            "slug",
            "title",
            "purpose",
            "field",
            *ProjectApplication.RESOURCES,
            "valid_from",
            "valid_until",
            "review_comment",
            "reviewed_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "id",
            "state",
            "applicant",
            "review_comment",
            "reviewed_by",
            "created_at",
            "updated_at",
        ]


class ReviewSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=applications.DECISIONS)
    comment = fields.CharField(required=False, allow_blank=True, default="")


class ApplicationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    KumoViewMixin,
    viewsets.GenericViewSet,
):
    """Project applications: yours, and those you may review (operators: all; an
    institutional reviewer: those of applicants with an identity at their institutions).
    Any other answers 404 like a missing one. POST applies; PATCH amends a returned one;
    ``review`` approves, returns or rejects (403 on your own); ``withdraw``."""

    serializer_class = ApplicationSerializer
    lookup_value_regex = r"[0-9]+"
    http_method_names = ["get", "post", "patch", "head", "options"]
    audit_object_type = "tenants.projectapplication"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ProjectApplication.objects.none()
        return selectors.applications_visible_to(
            self.request.user, token=self.request.auth
        ).select_related("applicant", "reviewed_by", "project")

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        project = data.pop("project", None)
        # a project you hold no role in is answered like a missing one
        if (
            project is not None
            and not self.request.user.is_staff
            and services.role_of(self.request.user, project) is None
        ):
            raise serializers.ValidationError({"project": ["no such project"]})
        serializer.instance = applications.application_submit(
            applicant=self.request.user, project=project, **data
        )

    def perform_update(self, serializer):
        data = {k: v for k, v in serializer.validated_data.items() if k not in ("kind", "project")}
        serializer.instance = applications.application_amend(
            application=serializer.instance, actor=self.request.user, **data
        )

    @extend_schema(request=ReviewSerializer, responses=ApplicationSerializer)
    @action(detail=True, methods=["post"])
    def review(self, request, pk=None):
        data = ReviewSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        application = applications.application_review(
            application=self.get_object(), reviewer=request.user, **data.validated_data
        )
        return Response(ApplicationSerializer(application).data)

    @extend_schema(request=None, responses=ApplicationSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        application = applications.application_withdraw(
            application=self.get_object(), actor=request.user
        )
        return Response(ApplicationSerializer(application).data)


# --- users, for operators -------------------------------------------------------------------------


class OperatorUserSerializer(fields.ModelSerializer):
    identities = IdentitySerializer(source="external_identities", many=True, read_only=True)
    password = fields.CharField(write_only=True, required=False, allow_null=True)
    has_password = serializers.SerializerMethodField()

    class Meta:
        model = User
        fields = [
            "id", "username", "email", "first_name", "last_name", "display_name",
            "organisation", "affiliation", "is_staff", "is_active", "has_password",
            "date_joined", "last_login", "identities", "password",
        ]  # fmt: skip
        read_only_fields = [
            "id", "display_name", "organisation", "affiliation", "is_active", "date_joined",
            "last_login", "identities", "has_password",
        ]  # fmt: skip

    def get_has_password(self, obj) -> bool:
        return obj.has_usable_password()


class OperatorUserViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, OperatorViewSet
):
    """Every user, for operators: list (``?q=`` searches username, e-mail, name,
    organisation), create, see identities; ``deactivate`` ends their sessions and revokes
    their tokens at once; ``reactivate``."""

    queryset = User.objects.prefetch_related("external_identities").order_by("username")
    serializer_class = OperatorUserSerializer
    lookup_field = "username"
    lookup_value_regex = r"[^/]+"
    audit_object_type = "tenants.user"

    def get_queryset(self):
        return selectors.users_search(self.request.query_params.get("q", ""))

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        serializer.instance = services.user_create(
            username=data["username"],
            email=data.get("email", ""),
            password=data.get("password"),
            is_staff=data.get("is_staff", False),
            first_name=data.get("first_name", ""),
            last_name=data.get("last_name", ""),
        )

    @extend_schema(request=None, responses=OperatorUserSerializer)
    @action(detail=True, methods=["post"])
    def deactivate(self, request, username=None):
        user = users.user_deactivate(user=self.get_object(), reason=request.data.get("reason", ""))
        return Response(OperatorUserSerializer(user).data)

    @extend_schema(request=None, responses=OperatorUserSerializer)
    @action(detail=True, methods=["post"])
    def reactivate(self, request, username=None):
        return Response(OperatorUserSerializer(users.user_reactivate(user=self.get_object())).data)


# --- institutional reviewers, for operators -------------------------------------------------------


class InstitutionReviewerSerializer(fields.ModelSerializer):
    user = fields.SlugRelatedField(
        slug_field="username",
        queryset=User.objects.all(),
        help_text="The reviewer's username.",
    )
    issuer = fields.CharField(
        max_length=reviewers.ISSUER_MAX,
        validators=[RegexValidator(reviewers.ISSUER, reviewers.NOT_AN_ISSUER)],
        help_text="The institution: its SAML IdP's entity ID, or its OIDC issuer (a URI).",
    )
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = InstitutionReviewer
        fields = ["id", "user", "issuer", "created_by", "created_at"]
        read_only_fields = ["id", "created_by", "created_at"]
        validators = []  # a pair designated already is the service's 409, not a 400


class OperatorInstitutionReviewerViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    OperatorViewSet,
):
    """Institutional reviewers: each reviews the applications of applicants with an identity
    at ``issuer`` (filters ``?user=<username>``, ``?issuer=``). POST designates (409 when the
    pair exists), DELETE removes."""

    queryset = InstitutionReviewer.objects.select_related("user", "created_by")
    serializer_class = InstitutionReviewerSerializer
    lookup_value_regex = r"[0-9]+"
    audit_object_type = "tenants.institutionreviewer"
    filterset_class = InstitutionReviewerFilterSet

    def perform_create(self, serializer):
        v = serializer.validated_data
        serializer.instance = reviewers.reviewer_designate(
            user=v["user"], issuer=v["issuer"], actor=self.request.user
        )

    def perform_destroy(self, instance):
        reviewers.reviewer_remove(reviewer=instance, actor=self.request.user)
