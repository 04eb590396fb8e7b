from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.middleware.csrf import get_token
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, permissions, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.errors import ErrorSerializer
from controlplane.api.viewsets import (
    KumoViewMixin,
    OperatorViewSet,
    ProjectScopedViewSet,
    UserViewSet,
)
from controlplane.errors import PermissionDenied
from tenants import mfa, selectors, services
from tenants.api import serializers as s
from tenants.choices import Role
from tenants.filtersets import MembershipFilterSet, ProjectFilterSet
from tenants.models import ApiToken, Membership, Project, SSHKey

# --- authentication ---------------------------------------------------------------------------


class LoginView(KumoViewMixin, APIView):
    """Log in with username and password: sets the session cookie and returns the CSRF token
    to send back as ``X-CSRFToken`` on writes. Failed attempts are throttled per username and
    address (429 while locked out)."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(
        request=s.LoginSerializer,
        responses={
            200: inline_serializer(
                "LoginResult", {"user": s.MeSerializer(), "csrf_token": serializers.CharField()}
            ),
            400: ErrorSerializer,
            429: ErrorSerializer,
        },
    )
    def post(self, request):
        data = s.LoginSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(
            request._request,
            username=data.validated_data["username"],
            password=data.validated_data["password"],
        )
        if user is None:
            return Response(
                {
                    "status": 400,
                    "code": "invalid_credentials",
                    "message": "Wrong username or password.",
                    "details": {},
                },
                status=400,
            )
        if mfa.has_totp(user):
            code = data.validated_data.get("otp", "")
            result = mfa.second_factor_check(user=user, code=code) if code else None
            if result is None or not result.ok:
                throttled = result is not None and result.throttled_for_s
                reason = (
                    "this account has a second factor: send otp"
                    if result is None
                    else f"too many wrong codes: wait {result.throttled_for_s} s"
                    if throttled
                    else "wrong code"
                )
                return Response(
                    {
                        "status": 429 if throttled else 400,
                        "code": "second_factor_required" if result is None else "invalid_otp",
                        "message": f"otp: {reason}",
                        "details": {"otp": [reason]},
                    },
                    status=429 if throttled else 400,
                )
        login(request._request, user)
        return Response(
            {"user": s.MeSerializer(user).data, "csrf_token": get_token(request._request)}
        )


class LogoutView(KumoViewMixin, APIView):
    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(KumoViewMixin, APIView):
    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        return Response(s.MeSerializer(request.user).data)


# --- projects ---------------------------------------------------------------------------------


class ProjectViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """The caller's projects. Anyone sees the projects they hold a role in; admins edit them;
    owners delete them (empty ones only). Operators create projects, or anyone when
    self-service is on."""

    model = Project
    serializer_class = s.ProjectSerializer
    filterset_class = ProjectFilterSet
    ordering_fields = ["slug", "name", "created_at"]
    lookup_field = "slug"
    lookup_url_kwarg = "project_slug"
    action_roles = {"update": Role.ADMIN, "partial_update": Role.ADMIN, "destroy": Role.OWNER}
    audit_object_type = "tenants.project"

    def get_permissions(self):
        if self.action in ("list", "create"):
            return [permissions.IsAuthenticated()]
        return super().get_permissions()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Project.objects.none()
        return selectors.projects_for(self.request.user, token=self.request.auth)

    def get_serializer_class(self):
        if self.action in ("update", "partial_update"):
            return s.ProjectUpdateSerializer
        return s.ProjectSerializer

    def get_object(self):
        project = self.project
        project.my_role = self.membership.role
        return project

    def perform_create(self, serializer):
        user = self.request.user
        if not (user.is_staff or settings.SELF_SERVICE_PROJECTS):
            raise PermissionDenied("projects are created by operators on this cloud")
        if selectors.token_project_id(self.request.auth) is not None:
            raise PermissionDenied("a token scoped to one project cannot create projects")
        project = services.project_create(owner=user, **serializer.validated_data)
        project.my_role = Role.OWNER
        serializer.instance = project

    def perform_update(self, serializer):
        project = services.project_update(project=self.project, **serializer.validated_data)
        project.my_role = self.membership.role
        serializer.instance = project

    def perform_destroy(self, instance):
        services.project_delete(project=instance)


class MemberViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """Members of a project and their roles. Admins change roles and remove members; only
    owners grant the owner role; a project always keeps one owner. There is no POST: people
    come in only by accepting an invitation (``projects/{slug}/invitations/``), which answers
    the same for every address, so no admin learns who has an account on the cloud."""

    model = Membership
    filterset_class = MembershipFilterSet
    ordering_fields = ["user__username", "role", "created_at"]
    lookup_field = "user__username"
    lookup_url_kwarg = "username"
    write_role = Role.ADMIN
    http_method_names = ["get", "patch", "delete", "head", "options"]
    audit_object_type = "tenants.membership"

    def get_queryset(self):
        return super().get_queryset().select_related("user")

    def get_serializer_class(self):
        if self.action == "partial_update":
            return s.MembershipUpdateSerializer
        return s.MembershipSerializer

    @extend_schema(request=s.MembershipUpdateSerializer, responses=s.MembershipSerializer)
    def partial_update(self, request, *args, **kwargs):
        data = s.MembershipUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        membership = self.get_object()
        if "role" in data.validated_data:  # a PATCH changes only what it names
            membership = services.membership_update(
                membership=membership, role=data.validated_data["role"], actor=request.user
            )
        return Response(s.MembershipSerializer(membership).data)

    def perform_destroy(self, instance):
        services.membership_remove(membership=instance, actor=self.request.user)


class QuotaViewSet(ProjectScopedViewSet):
    """The project's quota: per resource, the limit, what is in use and what is left."""

    model = Project
    pagination_class = None  # one report: neither paged nor filtered
    filter_backends = []

    @extend_schema(responses=s.QuotaReportSerializer)
    def list(self, request, *args, **kwargs):
        return Response(s.QuotaReportSerializer(selectors.quota_report(self.project)).data)


# --- the caller's SSH keys and tokens ----------------------------------------------------------


class SSHKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    UserViewSet,
):
    """Your SSH public keys. A malformed key answers 400 saying what is wrong with it."""

    model = SSHKey
    serializer_class = s.SSHKeySerializer
    audit_object_type = "tenants.sshkey"

    def perform_create(self, serializer):
        serializer.instance = services.sshkey_add(
            user=self.request.user, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        services.sshkey_delete(key=instance)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    UserViewSet,
):
    """Your API tokens. The secret is in the create response only; it is stored hashed.
    DELETE revokes (the token stays listed with ``revoked_at``)."""

    model = ApiToken
    serializer_class = s.ApiTokenSerializer
    scoped_token_may_write = True  # for its own project only: checked in create()
    audit_object_type = "tenants.apitoken"

    def get_queryset(self):
        return super().get_queryset().select_related("project")

    @extend_schema(request=s.ApiTokenSerializer, responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        scoped = selectors.token_project_id(request.auth)
        wanted = serializer.validated_data.get("project")
        if scoped is not None and (wanted is None or wanted.pk != scoped):
            raise PermissionDenied("a token scoped to one project can only make tokens for it")
        token, secret = services.token_create(user=request.user, **serializer.validated_data)
        data = s.ApiTokenCreatedSerializer(token, context=self.get_serializer_context()).data
        data["token"] = secret
        return Response(data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        scoped = selectors.token_project_id(self.request.auth)
        if scoped is not None and instance.project_id != scoped:
            raise PermissionDenied("a token scoped to one project can only revoke tokens for it")
        services.token_revoke(token=instance)


# --- operators --------------------------------------------------------------------------------


class OperatorProjectViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    OperatorViewSet,
):
    """Every project, for operators: create one for a named owner, suspend or reactivate it,
    set its quota."""

    queryset = Project.objects.select_related("owner")
    serializer_class = s.OperatorProjectSerializer
    filterset_class = ProjectFilterSet
    ordering_fields = ["slug", "name", "created_at", "status"]
    lookup_field = "slug"
    lookup_value_regex = r"[^/]+"
    audit_object_type = "tenants.project"

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        status_ = data.pop("status", None)
        project = services.project_create(**data)
        if status_:
            project = services.project_set_status(project=project, status=status_)
        serializer.instance = project

    def get_serializer_class(self):
        if self.action in ("update", "partial_update"):
            return s.OperatorProjectUpdateSerializer
        return s.OperatorProjectSerializer

    def perform_update(self, serializer):
        data = dict(serializer.validated_data)
        status_ = data.pop("status", None)
        # Read-only here (so a PUT of what GET returned works), but asking to change them is
        # answered, not ignored.
        asked, project = self.request.data, serializer.instance
        if asked.get("owner", project.owner.username) != project.owner.username:
            raise serializers.ValidationError(
                {"owner": "change owners through the members endpoint"}
            )
        if asked.get("slug", project.slug) != project.slug:
            raise serializers.ValidationError({"slug": "a project's slug does not change"})
        project = services.project_update(project=project, **data)
        if status_:
            project = services.project_set_status(project=project, status=status_)
        serializer.instance = project

    @extend_schema(request=s.QuotaLimitsSerializer, responses=s.QuotaReportSerializer)
    @action(detail=True, methods=["get", "patch"])
    def quota(self, request, slug=None):
        project = self.get_object()
        if request.method == "PATCH":
            data = s.QuotaLimitsSerializer(data=request.data, partial=True)
            data.is_valid(raise_exception=True)
            services.quota_set(project=project, **data.validated_data)
        return Response(s.QuotaReportSerializer(selectors.quota_report(project)).data)
