"""The base views of the API. Isolation, roles, auditing and idempotency live here, once.

- ``KumoViewMixin``: conventions of every API view (audit actor, Idempotency-Key on POST,
  auditing of refused writes).
- ``ProjectScopedViewSet``: every ``/api/v1/projects/{project_slug}/…`` endpoint. It resolves
  the project through the caller's membership (no role, or a token scoped elsewhere: 404,
  exactly like a missing project), checks the caller's role for the action (too low: 403),
  and reads only through ``Model.objects.for_project(project)``. A view never filters by
  project by hand.
- ``OperatorViewSet``: ``/api/v1/admin/…``, staff only.
"""

from django.utils.functional import cached_property
from rest_framework import filters, mixins, permissions, viewsets
from rest_framework.response import Response

from controlplane import audit
from controlplane.api import idempotency
from controlplane.api.fastread import ReadPathMixin
from controlplane.api.filters import FilterBackend
from controlplane.errors import NotFound, PermissionDenied
from tenants.choices import Role
from tenants.models import Project
from tenants.selectors import membership_for, token_project_id


class KumoViewMixin(ReadPathMixin):
    #: names the object type in audit events of refused writes, e.g. "tenants.membership"
    audit_object_type = ""

    def perform_authentication(self, request):
        # Before the permission checks, so a refused write is audited under its actor.
        super().perform_authentication(request)
        audit.set_actor(request.user)

    def initial(self, request, *args, **kwargs):
        # A name with a NUL character names nothing, like a path the URLs don't match (and
        # PostgreSQL refuses to even look it up).
        if any("\x00" in str(value) for value in kwargs.values()):
            raise NotFound("Not found.")
        super().initial(request, *args, **kwargs)
        # Keys are kept per user: an anonymous POST (the login) has no one to keep them for.
        keyed = idempotency.HEADER in request.headers and request.user.is_authenticated
        if request.method == "POST" and keyed:
            handler = getattr(self, "post", None)
            if handler is not None:
                self.post = lambda req, *a, **kw: idempotency.run(handler, req, *a, **kw)

    def filter_queryset(self, queryset):
        # Filters and ordering choose among a list; an object's URL already names it. (DRF
        # would otherwise build a FilterSet for every detail request, half its cost.)
        if getattr(self, "action", None) != "list":
            return queryset
        return super().filter_queryset(queryset)

    def _plain_list(self) -> bool:
        # Only the page and its size given; Kumo's own filtering (nothing without a value)
        # and DRF's ordering (the view's own without a parameter).
        paginator = self.paginator
        given = set(self.request.query_params)
        if type(self).filter_queryset is not KumoViewMixin.filter_queryset or not given <= {
            getattr(paginator, "page_query_param", None),
            getattr(paginator, "page_size_query_param", None),
        }:
            return False
        backends = tuple(self.filter_backends)
        if not set(backends) <= {FilterBackend, filters.OrderingFilter}:
            return False
        return FilterBackend not in backends or FilterBackend()._filters_nothing(self.request, self)

    def audit_refusal(self) -> dict:
        """What a refused write of this view was aimed at: the fields of its audit event."""
        action = getattr(self, "action", None)
        lookup = getattr(self, "lookup_url_kwarg", None) or getattr(self, "lookup_field", "pk")
        return {
            "action": f"{self.audit_object_type.split('.')[-1]}.{action}"
            if action and self.audit_object_type
            else f"{self.request.method} {self.request.path}",
            "object_type": self.audit_object_type,
            "object_id": str(self.kwargs.get(lookup, "")),
            "project": None,
        }


class ProjectRolePermission(permissions.BasePermission):
    """The caller must hold at least the role the view asks for this action."""

    def has_permission(self, request, view):
        membership = view.membership  # raises NotFound when the caller has no role there
        required = view.required_role()
        if Role.at_least(membership.role, required):
            return True
        raise PermissionDenied(
            f"your role in project {membership.project.slug} is {membership.role}; "
            f"this needs {required} or above"
        )


class ProjectScopedViewSet(KumoViewMixin, viewsets.GenericViewSet):
    """Base of every endpoint under ``/api/v1/projects/{project_slug}/``.

    Subclasses set ``model`` (a ProjectOwnedModel) and may set ``read_role``,
    ``write_role`` or per-action ``action_roles``.
    """

    model = None
    read_role = Role.READER
    write_role = Role.MEMBER
    action_roles: dict[str, str] = {}
    permission_classes = [permissions.IsAuthenticated, ProjectRolePermission]
    lookup_value_regex = r"[^/]+"

    def initialize_request(self, request, *args, **kwargs):
        request = super().initialize_request(request, *args, **kwargs)
        # Names the project to the token authentication, whose one query then also reads the
        # caller's membership there (tenants.selectors.token_by_prefix). A name with a NUL
        # character names nothing (``initial`` answers 404), and PostgreSQL refuses it.
        slug = kwargs.get("project_slug")
        request.project_slug = slug if slug is not None and "\x00" not in slug else None
        return request

    @cached_property
    def membership(self):
        membership = membership_for(
            self.request.user, self.kwargs.get("project_slug", ""), token=self.request.auth
        )
        if membership is None:
            raise NotFound("Not found.")
        return membership

    @property
    def project(self):
        return self.membership.project

    def audit_refusal(self) -> dict:
        # The project only when it was already resolved: a refusal costs no extra query.
        membership = self.__dict__.get("membership")
        return {**super().audit_refusal(), "project": membership.project if membership else None}

    def required_role(self) -> str:
        if self.action in self.action_roles:
            return self.action_roles[self.action]
        return (
            self.read_role if self.request.method in permissions.SAFE_METHODS else self.write_role
        )

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no request
            return self.model.objects.none()
        queryset = self.model.objects.all()
        if getattr(self, "action", None) == "list":
            # A plain list's page runs SQL compiled once (``fastread.CompiledList``) and never
            # reads this queryset: its project filter is built only when the query is read
            # (Django's deferred filter, as its related managers defer theirs), the same
            # filter, in the same place, as built at once.
            queryset._defer_next_filter = True
        return queryset.for_project(self.project)

    def _read_scope(self):
        # The project's id is the one value: compiled once, the scoped queryset of a stand-in
        # project answers for every project, and each request binds its own project's id.
        if type(self).get_queryset is not ProjectScopedViewSet.get_queryset:
            return None
        model = self.model

        def scoped(project_id):
            return model.objects.for_project(Project(pk=project_id))

        return (self.project.pk,), scoped

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if not getattr(self, "swagger_fake_view", False) and "project_slug" in self.kwargs:
            context["project"] = self.project
        return context


class OperatorViewSet(KumoViewMixin, viewsets.GenericViewSet):
    """Base of every endpoint under ``/api/v1/admin/``: staff only."""

    permission_classes = [permissions.IsAdminUser]


class UserViewSet(KumoViewMixin, viewsets.GenericViewSet):
    """Base of the caller's own things (``/api/v1/user/…``): SSH keys, tokens.

    These reach across all the caller's projects, so a token scoped to one project reads
    them but changes them only where a subclass allows it (``scoped_token_may_write``).
    """

    model = None
    scoped_token_may_write = False

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        unsafe = request.method not in permissions.SAFE_METHODS
        if unsafe and not self.scoped_token_may_write and token_project_id(request.auth):
            raise PermissionDenied("a token scoped to one project cannot change your account")

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.model.objects.none()
        return self.model.objects.filter(user=self.request.user)


class ReadOnlyProjectViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, ProjectScopedViewSet
):
    pass


def accepted(operation, serializer_class, request) -> Response:
    """The answer to anything asynchronous: 202, the operation, and where to poll it."""
    data = serializer_class(operation, context={"request": request}).data
    return Response(data, status=202, headers={"Location": data["url"]})


class ServiceViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """A project's objects whose writes go through their app's services: list, retrieve
    and delete from the scoped queryset; a create or an action reads its own input
    serializer (``_input``) and answers the object as ``serializer_class`` shows it, read
    again through the scoped queryset (``_answer``)."""

    def _input(self, serializer_class):
        data = serializer_class(data=self.request.data, partial=self.action == "partial_update")
        data.is_valid(raise_exception=True)
        return data.validated_data

    def _answer(self, instance, status=200):
        instance = self.get_queryset().get(pk=instance.pk)
        return Response(self.get_serializer(instance).data, status=status)
