import time

from django.conf import settings
from django.db.models import Count, Prefetch, Q, prefetch_related_objects
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from compute import services
from compute.api import serializers as s
from compute.choices import DeviceKind, VmState
from compute.filtersets import (
    DeviceFilterSet,
    HostFilterSet,
    ImageFilterSet,
    LeaseFilterSet,
    TemplateFilterSet,
    VirtualMachineFilterSet,
)
from compute.leases import HOLDING as LEASE_HOLDING
from compute.models import (
    CapacityGuarantee,
    Device,
    Host,
    Image,
    Lease,
    PlacementGroup,
    Template,
    VirtualMachine,
)
from controlplane.api.errors import ErrorSerializer
from controlplane.api.serializers import OperationSerializer
from controlplane.api.viewsets import (
    KumoViewMixin,
    OperatorViewSet,
    ProjectScopedViewSet,
    accepted,
)
from controlplane.choices import OperationState
from controlplane.errors import HostUnavailable, InvalidInput, NotFound, PermissionDenied
from controlplane.models import Operation
from network.models import FixedIp, Network, Port
from tenants.choices import Role
from tenants.models import Project, SSHKey

# --- a project's VMs, images and placement groups ------------------------------------------------


def wait_for_operation(operation: Operation, timeout_s: float) -> Operation | None:
    """The operation once finished, read afresh every 50 ms for up to ``timeout_s``; None
    when it is still unfinished then."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = Operation.objects.get(pk=operation.pk)
        if current.state in (OperationState.SUCCEEDED, OperationState.FAILED):
            return current
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


# What a VM's answer reads beside its row: its GPUs' addresses, its ports with their networks
# and addresses.
_VM_PREFETCH = (
    Prefetch("devices", queryset=Device.objects.only("pk", "pci_address", "vm")),
    Prefetch(
        "ports",
        queryset=Port.objects.select_related("network").prefetch_related(
            Prefetch("fixed_ips", queryset=FixedIp.objects.order_by("address"))
        ),
    ),
)


def _vm_queryset(qs):
    return qs.select_related(
        "project", "template", "placement_group", "host", "lease"
    ).prefetch_related(*_VM_PREFETCH)


class VirtualMachineViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ProjectScopedViewSet):
    """The project's VMs. Creating, starting, stopping, rebooting and deleting answer 202
    with an operation to poll; an action the VM's state does not allow answers 409 naming
    the state. Deleted VMs stay listed (``state=deleted``) for the record."""

    model = VirtualMachine
    serializer_class = s.VirtualMachineSerializer
    filterset_class = VirtualMachineFilterSet
    ordering_fields = ["created_at", "name", "state"]
    lookup_value_regex = r"[0-9a-fA-F-]{36}"
    audit_object_type = "compute.virtualmachine"
    # What the guest printed may hold what its owner would not show a reader.
    action_roles = {"console_log": Role.MEMBER}

    def get_queryset(self):
        return _vm_queryset(super().get_queryset())

    @extend_schema(
        request=s.VirtualMachineCreateSerializer,
        responses={
            202: OpenApiResponse(
                s.VirtualMachineAcceptedSerializer,
                description="Accepted: the VM exists and its creation goes on; ``operation`` "
                "is the URL to follow it, the ``Location`` header the VM's URL.",
            )
        },
    )
    def create(self, request, project_slug=None):
        data = s.VirtualMachineCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        project = self.project
        template = Template.objects.filter(name=v["template"]).first()
        if template is None:
            raise InvalidInput.field("template", f"no template named {v['template']!r}")
        image = Image.objects.usable_by(project).filter(pk=v["image"]).first()
        if image is None:
            raise InvalidInput.field("image", f"no image {v['image']} for this project")
        keys = dict(
            SSHKey.objects.filter(user=request.user, name__in=v["ssh_keys"]).values_list(
                "name", "public_key"
            )
        )
        missing = [name for name in v["ssh_keys"] if name not in keys]
        if missing:
            raise InvalidInput.field("ssh_keys", f"you have no SSH key named {missing[0]!r}")
        group = None
        if v.get("placement_group"):
            group = (
                PlacementGroup.objects.for_project(project)
                .filter(name=v["placement_group"])
                .first()
            )
            if group is None:
                raise InvalidInput.field(
                    "placement_group", f"no placement group {v['placement_group']!r} here"
                )
        lease = None
        if v.get("lease"):
            lease = (
                Lease.objects.for_project(project)
                .filter(name=v["lease"], state__in=LEASE_HOLDING)
                .first()
            )
            if lease is None:
                raise InvalidInput.field("lease", f"no lease {v['lease']!r} here")
        nics = []
        for index, nic in enumerate(v["nics"]):
            network = Network.objects.for_project(project).filter(name=nic["network"]).first()
            if network is None:
                raise InvalidInput.field(
                    "nics", f"nic {index}: no network named {nic['network']!r} in this project"
                )
            nics.append({**nic, "network": network})
        vm, operation = services.vm_create(
            project=project,
            name=v["name"],
            template=template,
            image=image,
            ssh_keys=[keys[name] for name in v["ssh_keys"]],
            user_data=v["user_data"],
            priority=v["priority"],
            placement_group=group,
            lease=lease,
            wait_for_capacity=v["wait_for_capacity"],
            nics=nics,
            actor=request.user,
        )
        # The answer is made from the VM as the create left it (its row, its project,
        # template, group, lease and host as the create read them; its GPUs as its host's
        # work read them), not read again.
        prefetch_related_objects([vm], *_VM_PREFETCH)
        body = s.VirtualMachineSerializer(vm, context=self.get_serializer_context()).data
        body["operation"] = OperationSerializer(operation, context={"request": request}).data["url"]
        return Response(body, status=202, headers={"Location": body["url"]})

    def _action(self, service):
        operation = service(vm=self.get_object_for_update(), actor=self.request.user)[1]
        return accepted(operation, OperationSerializer, self.request)

    def get_object_for_update(self):
        vm = self.get_object()
        vm.project = self.project
        return vm

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, project_slug=None, pk=None):
        return self._action(services.vm_start)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, project_slug=None, pk=None):
        return self._action(services.vm_stop)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def shelve(self, request, project_slug=None, pk=None):
        """Stop the VM, keep its root disk and release every claim (GPUs, vCPUs, memory,
        host); 409 unless it is running or stopped with no action in flight."""
        return self._action(services.vm_shelve)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def unshelve(self, request, project_slug=None, pk=None):
        """Place the shelved VM again anywhere it fits (waiting for capacity if none does)
        and boot its kept disk; 409 unless it is shelved, or when its quota is used."""
        return self._action(services.vm_unshelve)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def reboot(self, request, project_slug=None, pk=None):
        return self._action(services.vm_reboot)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def reset(self, request, project_slug=None, pk=None):
        """Hard reset (the reset button): the guest reboots at once, its OS not asked."""
        return self._action(services.vm_reset)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"], url_path="power-off")
    def power_off(self, request, project_slug=None, pk=None):
        """Immediate power-off (pulling the plug): stopped at once, its OS not asked."""
        return self._action(services.vm_power_off)

    @extend_schema(
        parameters=[s.ConsoleLogQuerySerializer],
        responses={
            200: s.ConsoleLogSerializer,
            202: OperationSerializer,
            400: OpenApiResponse(ErrorSerializer, description="bytes or lines out of range"),
            409: OpenApiResponse(ErrorSerializer, description="the VM is on no host"),
            502: OpenApiResponse(ErrorSerializer, description="the host did not give the log"),
        },
    )
    @action(detail=True, methods=["get"], url_path="console-log")
    def console_log(self, request, project_slug=None, pk=None):
        """The last 64 KiB (or ``bytes``, or the last ``lines``) of the guest's serial
        console, read from its host. The answer waits a few seconds for the host
        (``KUMO_CONSOLE_LOG_WAIT_S``); past that it is 202 with the operation, whose
        result holds the output once the host answers."""
        query = s.ConsoleLogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        operation = services.vm_console_log(
            vm=self.get_object_for_update(), max_bytes=query.validated_data["bytes"],
            actor=request.user,
        )  # fmt: skip
        done = wait_for_operation(operation, settings.CONSOLE_LOG_WAIT_S)
        if done is None:
            return accepted(operation, OperationSerializer, request)
        if done.state != OperationState.SUCCEEDED:
            raise HostUnavailable(
                f"the host did not give the console log: {done.error_message}",
                code=done.error_code or "host_error",
            )
        output = done.result.get("output", "")
        lines = query.validated_data.get("lines")
        if lines:
            output = "".join(output.splitlines(keepends=True)[-lines:])
        return Response({"output": output, "bytes": done.result.get("bytes", 0)})

    @extend_schema(
        request=None,
        responses={
            200: s.ConsoleTicketSerializer,
            409: OpenApiResponse(
                ErrorSerializer, description="the VM is not running, or on a simulated host"
            ),
        },
    )
    @action(detail=True, methods=["post"])
    def console(self, request, project_slug=None, pk=None):
        """A token to the guest's interactive serial console through the console proxy:
        ``url`` is the websocket to open (the token in its query). The token connects once,
        within ``KUMO_CONSOLE_TOKEN_TTL_S`` (60 s), to this VM, for the caller; the proxy
        checks again then that the caller may still operate the VM and that it runs."""
        ticket = services.console_token_issue(vm=self.get_object_for_update(), user=request.user)
        return Response(s.ConsoleTicketSerializer(ticket).data)

    @extend_schema(request=None, responses={202: OperationSerializer})
    def destroy(self, request, project_slug=None, pk=None):
        return self._action(services.vm_delete)


def _upload_length(request) -> int | None:
    """The body's length from Content-Length; None for a chunked body (read to EOF from
    the server's input, which de-chunks it); 0 when there is neither."""
    raw = request.META.get("CONTENT_LENGTH")
    if raw:
        try:
            length = int(raw)
        except ValueError:
            raise InvalidInput.field("Content-Length", "must be a number of bytes") from None
        if length < 0:
            raise InvalidInput.field("Content-Length", "must be a number of bytes")
        return length
    if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    return 0  # neither: HTTP says the body is empty


def _upload_stream(request, length: int | None):
    """Where the body is read from, one bounded read at a time (never ``request.body`` or
    DRF's parsers, which would hold it whole): Django's request (bounded by
    Content-Length), or the server's de-chunked input."""
    django_request = request._request
    if length is not None:
        return django_request
    return django_request.META["wsgi.input"]


class _ImageFile:
    """``PUT …/images/{id}/file``: the image's bytes, streamed (``image_upload``)."""

    @extend_schema(
        request={"application/octet-stream": {"type": "string", "format": "binary"}},
        responses={
            200: s.ImageSerializer,
            400: OpenApiResponse(description="checksum mismatch, empty or short body: failed"),
            409: OpenApiResponse(description="the image is not uploading"),
            413: OpenApiResponse(description="larger than KUMO_IMAGE_MAX_BYTES: failed"),
        },
    )
    @action(detail=True, methods=["put"], url_path="file", parser_classes=[])
    def file(self, request, pk=None, **kwargs):
        """Upload the image's bytes (raw, ``application/octet-stream``). The image turns
        active with the SHA-256 and size of what arrived, or failed with the reason."""
        image = self.get_object_for_upload()
        length = _upload_length(request)
        image = services.image_upload(
            image=image, stream=_upload_stream(request, length), length=length
        )
        return Response(self.output_serializer(image, context=self.get_serializer_context()).data)


class ProjectImageViewSet(
    _ImageFile,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    ProjectScopedViewSet,
):
    """Images the project may boot: the public ones and its own. Members register the
    project's own images (``POST``: the record, ``uploading``), upload their bytes
    (``PUT …/{id}/file``) and delete them; public images are the operators'. Deleting an
    image a VM uses answers 409."""

    model = Image
    serializer_class = s.ImageSerializer
    output_serializer = s.ImageSerializer
    lookup_value_regex = r"[0-9]+"
    filterset_class = ImageFilterSet
    ordering_fields = ["name", "created_at"]
    audit_object_type = "compute.image"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Image.objects.none()
        return Image.objects.visible_to(self.project).select_related("project")

    def get_object_for_upload(self):
        image = self.get_object()
        if image.project_id != self.project.pk:
            raise PermissionDenied("a public image is uploaded by operators only")
        return image

    @extend_schema(request=s.ImageCreateSerializer, responses={201: s.ImageSerializer})
    def create(self, request, project_slug=None):
        data = s.ImageCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        image = services.image_register(project=self.project, **data.validated_data)
        body = s.ImageSerializer(image, context=self.get_serializer_context()).data
        return Response(body, status=201)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, project_slug=None, pk=None):
        instance = self.get_object()
        if instance.project_id != self.project.pk:
            raise PermissionDenied("a public image is withdrawn by operators only")
        services.image_delete(image=instance)
        return Response(status=204)


class PlacementGroupViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """Placement groups: VMs created in one are placed on one host (affinity), on distinct
    hosts (anti-affinity) or in one rack (compact)."""

    model = PlacementGroup
    serializer_class = s.PlacementGroupSerializer
    ordering_fields = ["name", "created_at"]
    audit_object_type = "compute.placementgroup"

    def perform_create(self, serializer):
        serializer.instance = services.placement_group_create(
            project=self.project, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        services.placement_group_delete(group=instance)


def _lease_answer(view, lease, status=200):
    """``lease`` as the view's scoped queryset reads it (its project and creator joined)."""
    return Response(s.LeaseSerializer(view.get_queryset().get(pk=lease.pk)).data, status=status)


class LeaseViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, ProjectScopedViewSet
):
    """Reservations of GPUs over a period (``compute.services.leases``). Members see them
    and create VMs in them (``lease`` on a VM's create); admins reserve and cancel, since a
    lease is billed whether it is used or not. A lease that does not fit answers 409 with
    the earliest period that does (``details.earliest_starts_at``)."""

    model = Lease
    serializer_class = s.LeaseSerializer
    filterset_class = LeaseFilterSet
    ordering_fields = ["starts_at", "ends_at", "created_at", "name"]
    write_role = Role.ADMIN
    audit_object_type = "compute.lease"

    def get_queryset(self):
        return super().get_queryset().select_related("project", "created_by")

    @extend_schema(request=s.LeaseCreateSerializer, responses={201: s.LeaseSerializer})
    def create(self, request, *args, **kwargs):
        data = s.LeaseCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        lease = services.lease_create(
            project=self.project, actor=request.user, **data.validated_data
        )
        return _lease_answer(self, lease, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.LeaseUpdateSerializer, responses=s.LeaseSerializer)
    def partial_update(self, request, *args, **kwargs):
        """Lend its idle GPUs to spot VMs, or stop (the borrowers get their eviction
        notice now); end it later (admitted again for the added time: 409 with
        ``details.latest_ends_at`` when it does not fit) or earlier; move its start before
        it holds GPUs; hold more GPUs or fewer; 409 once it has ended."""
        return _lease_updated(self, request)

    @extend_schema(request=None, responses=s.LeaseSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, *args, **kwargs):
        """Cancel: not started, it is dropped and billed nothing; started, it ends now (its
        VMs are shelved)."""
        return _lease_answer(
            self, services.lease_cancel(lease=self.get_object(), actor=request.user)
        )


def _lease_updated(view, request):
    """A PATCH of a lease (``lend_idle``, ``starts_at``, ``ends_at``, ``gpus``), by its
    project's admins or by operators. A PATCH naming nothing changes nothing."""
    data = s.LeaseUpdateSerializer(data=request.data)
    data.is_valid(raise_exception=True)
    lease = view.get_object()
    if data.validated_data:
        lease = services.lease_update(lease=lease, **data.validated_data)
    return _lease_answer(view, lease)


class ReclamationViewSet(ProjectScopedViewSet):
    """Reclamation as it concerns the project: its guaranteed minimum of GPUs (spot
    preemption never takes its use below it), the thresholds in force (idle, expiry), and
    every step announced for its VMs with the time it will happen."""

    model = Project
    pagination_class = None  # one report: neither paged nor filtered
    filter_backends = []

    @extend_schema(responses=s.ReclamationReportSerializer)
    def list(self, request, *args, **kwargs):
        report = services.reclamation_report(self.project)
        return Response(s.ReclamationReportSerializer(report).data)


# --- templates: everyone reads them, operators write them ---------------------------------------


class TemplateViewSet(
    KumoViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """The VM sizes on offer."""

    queryset = Template.objects.filter(active=True)
    serializer_class = s.TemplateSerializer
    permission_classes = [IsAuthenticated]
    lookup_field = "name"
    filterset_class = TemplateFilterSet
    ordering_fields = ["name", "vcpus", "gpus"]


class OperatorTemplateViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, OperatorViewSet
):
    """Every template, withdrawn ones too; operators add sizes and withdraw them."""

    queryset = Template.objects.all()
    serializer_class = s.TemplateSerializer
    filterset_class = TemplateFilterSet
    lookup_field = "name"
    ordering_fields = ["name", "vcpus", "gpus"]
    audit_object_type = "compute.template"

    def perform_create(self, serializer):
        serializer.instance = services.template_create(**serializer.validated_data)

    @extend_schema(request=s.TemplateUpdateSerializer, responses=s.TemplateSerializer)
    def partial_update(self, request, name=None):
        data = s.TemplateUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        template = services.template_update(template=self.get_object(), **data.validated_data)
        return Response(s.TemplateSerializer(template).data)


class OperatorImageViewSet(
    _ImageFile,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    OperatorViewSet,
):
    """Every image; images created here are public. (An image pre-staged at the same path
    on every host is registered with ``compute.services.image_create``, not here.)"""

    queryset = Image.objects.select_related("project")
    serializer_class = s.ImageSerializer
    output_serializer = s.ImageSerializer
    lookup_value_regex = r"[0-9]+"
    filterset_class = ImageFilterSet
    ordering_fields = ["name", "created_at"]
    audit_object_type = "compute.image"

    def get_object_for_upload(self):
        return self.get_object()

    @extend_schema(request=s.ImageCreateSerializer, responses={201: s.ImageSerializer})
    def create(self, request):
        data = s.ImageCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        image = services.image_register(**data.validated_data)
        return Response(s.ImageSerializer(image).data, status=201)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        services.image_delete(image=self.get_object())
        return Response(status=204)


# --- the fleet, for operators --------------------------------------------------------------------


class OperatorHostViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """The fleet, for operators: hosts, capacity and use, agents' liveness, labels, overcommit,
    drain and maintenance."""

    queryset = Host.objects.order_by("name").annotate(
        gpus=Count("devices", filter=Q(devices__kind=DeviceKind.GPU, devices__present=True)),
        gpus_free=Count(
            "devices",
            filter=Q(devices__kind=DeviceKind.GPU, devices__present=True, devices__vm__isnull=True),
        ),
    )
    serializer_class = s.HostSerializer
    filterset_class = HostFilterSet
    ordering_fields = ["name", "state", "last_heartbeat_at"]
    lookup_field = "name"
    audit_object_type = "compute.host"

    def _fresh(self, host):
        return self.get_queryset().get(pk=host.pk)

    @extend_schema(request=s.HostUpdateSerializer, responses=s.HostSerializer)
    def partial_update(self, request, name=None):
        data = s.HostUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        host = services.host_update(host=self.get_object(), **data.validated_data)
        return Response(s.HostSerializer(self._fresh(host)).data)

    @extend_schema(request=s.HostStateSerializer, responses=s.HostSerializer)
    @action(detail=True, methods=["post"], url_path="state")
    def set_state(self, request, name=None):
        data = s.HostStateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        host = services.host_set_state(host=self.get_object(), **data.validated_data)
        return Response(s.HostSerializer(self._fresh(host)).data)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def ping(self, request, name=None):
        operation = services.host_ping(host=self.get_object(), actor=request.user)
        return accepted(operation, OperationSerializer, request)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def guests(self, request, name=None):
        """Ask the host's agent for every Kumo guest it holds, read from libvirt."""
        operation = services.host_guests_list(host=self.get_object(), actor=request.user)
        return accepted(operation, OperationSerializer, request)


class OperatorDeviceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """Every GPU and RDMA function of the fleet, and which VM holds it."""

    queryset = Device.objects.select_related("host")
    serializer_class = s.DeviceSerializer
    filterset_class = DeviceFilterSet
    ordering_fields = ["host__name", "pci_address"]


class OperatorCapacityGuaranteeViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet
):
    """Projects' guaranteed minimums of GPUs by model and of vCPUs (mdx's Rmin).
    ``PUT …/{project}/`` sets one (0 removes it): other projects' on-demand VMs never take
    its headroom, spot preemption never takes a project's use below it, and minimums that
    add up to more than the fleet holds answer 409 saying by how much."""

    queryset = CapacityGuarantee.objects.select_related("project")
    serializer_class = s.CapacityGuaranteeSerializer
    lookup_field = "project__slug"
    lookup_url_kwarg = "project"
    ordering_fields = ["min_gpus"]
    audit_object_type = "compute.capacityguarantee"

    @extend_schema(request=s.CapacityGuaranteeSerializer, responses=s.CapacityGuaranteeSerializer)
    def update(self, request, project=None):
        data = s.CapacityGuaranteeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target = Project.objects.filter(slug=project).first()
        if target is None:
            raise NotFound(f"no project {project!r}")
        v = data.validated_data
        guarantee = services.guarantee_set(
            project=target,
            min_gpus=v["min_gpus"],
            gpu_model=v.get("gpu_model", ""),
            min_vcpus=v.get("min_vcpus", 0),
            actor=request.user,
        )
        return Response(s.CapacityGuaranteeSerializer(guarantee).data)


class OperatorLeaseViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """Every project's leases: the fleet's calendar (``ends_after`` and ``starts_before``
    select a window); operators cancel any, change whether it lends its idle GPUs, move its
    period and change its size."""

    queryset = Lease.objects.select_related("project", "created_by")
    serializer_class = s.LeaseSerializer
    filterset_class = LeaseFilterSet
    ordering_fields = ["starts_at", "ends_at", "created_at"]
    audit_object_type = "compute.lease"

    @extend_schema(request=s.LeaseUpdateSerializer, responses=s.LeaseSerializer)
    def partial_update(self, request, pk=None):
        """Lend its idle GPUs to spot VMs, or stop (the borrowers get their eviction
        notice now); end it later (admitted again for the added time: 409 with
        ``details.latest_ends_at`` when it does not fit) or earlier; move its start before
        it holds GPUs; hold more GPUs or fewer; 409 once it has ended."""
        return _lease_updated(self, request)

    @extend_schema(request=None, responses=s.LeaseSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return _lease_answer(
            self, services.lease_cancel(lease=self.get_object(), actor=request.user)
        )


class OperatorVirtualMachineViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet
):
    """Every VM of every project, for operators."""

    queryset = _vm_queryset(VirtualMachine.objects.all())
    serializer_class = s.VirtualMachineSerializer
    filterset_class = VirtualMachineFilterSet
    ordering_fields = ["created_at", "name", "state"]
    lookup_value_regex = r"[0-9a-fA-F-]{36}"

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def describe(self, request, pk=None):
        """Ask the VM's host for the guest as libvirt holds it (domain XML, power state)."""
        vm = self.get_object()
        if vm.state == VmState.DELETED:
            raise NotFound("the VM is deleted")
        operation = services.vm_describe(vm=vm, actor=request.user)
        return accepted(operation, OperationSerializer, request)
