"""The VM life cycle: create, start, stop, reboot, delete, and placing pending VMs.

Every action is guarded twice: a precondition here (``ACTIONS``: an action a state does
not allow answers 409 naming the state), and a conditional UPDATE on the generation and
state the action read, so of two racing requests exactly one wins and the other gets 409.
The host work each action asks for goes out after commit, carrying the new generation.
"""

import heapq
import itertools
import logging
from collections.abc import Iterator

from django.db import transaction
from django.db.models import Exists
from django.utils import timezone

from compute import placement
from compute.choices import Priority, VmState, VmTask
from compute.leases import check_vm_lease
from compute.models import (
    PLAIN_SPOT,
    QUEUED,
    SIZE,
    UNTOLD,
    Image,
    PlacementGroup,
    Template,
    VirtualMachine,
)
from compute.protocol import (
    CONSOLE_LOG_MAX_BYTES,
    VM_CONSOLE_LOG_TASK,
)
from compute.scheduler import NoValidHost, Request
from compute.services.lifecycle import (
    current_operation,
    guard,
    lock,
    open_operation,
    place,
    read_devices,
    require_active,
    send_apply,
    supersede_operations,
    transition,
)
from controlplane import agents, audit
from controlplane.compiled import Compiled, insert, prefetched, update_where, value_kind
from controlplane.errors import Conflict, InvalidInput
from controlplane.models import Operation
from controlplane.services import operation_create, operation_finish
from network.choices import NetworkKind
from tenants import quotas, usage
from tenants.models import Project

log = logging.getLogger(__name__)

# --- create ---------------------------------------------------------------------------------


# ``vm_create``'s checks of the image and the name, in one read compiled once: every create
# makes them. A row when the image is usable by the project, saying whether a VM of the
# project (not deleted) has the name.
_IMAGE_AND_NAME = Compiled(
    lambda project_id, pk, name: (
        Image.objects.usable_by(project_id)
        .filter(pk=pk)
        .annotate(
            taken=Exists(
                VirtualMachine.objects.for_project(project_id)
                .filter(name=name)
                .exclude(state=VmState.DELETED)
            )
        )
        .values_list("taken")[:1]
    ),
    int,
    int,
    str,
)


@transaction.atomic
def vm_create(
    *,
    project: Project,
    name: str,
    template: Template,
    image: Image,
    ssh_keys: list[str] | tuple[str, ...] = (),
    user_data: str = "",
    priority: str = Priority.ON_DEMAND,
    placement_group: PlacementGroup | None = None,
    wait_for_capacity: bool = True,
    nics: list[dict] | tuple[dict, ...] = (),
    lease=None,
    actor=None,
) -> tuple[VirtualMachine, Operation]:
    """Create a VM and try to place it, in one transaction.

    ``lease``: a reservation of the project (``compute.services.leases``); the VM is placed
    on its GPUs once it has started, waits pending until then, and is shelved at its end.

    ``nics``: one ``{"network": Network, "fixed_ip": "", "security_groups": None}`` per
    NIC, in order; each becomes a port on that network (``network.services.port_create``),
    bound to the VM's host once it is placed.

    The quota is claimed first (the project's quota row is locked, so concurrent creates in
    a project count each other). Then the scheduler claims a host: placed, the VM is
    provisioning and its host is told to build it after commit. When nothing fits, the VM
    stays pending with the reason and the controller places it when room appears, unless
    ``wait_for_capacity`` is false: then nothing is created and the answer is 409.
    """
    require_active(project)
    if not template.active:
        raise InvalidInput.field("template", f"template {template.name} is withdrawn")
    image_and_name = _IMAGE_AND_NAME.tuples(project.pk, image.pk, name)
    if not image_and_name:
        raise InvalidInput.field("image", "no such image for this project")
    if placement_group is not None and placement_group.project_id != project.pk:
        raise InvalidInput.field("placement_group", "no such placement group in this project")
    if priority == Priority.SPOT and not template.spot_allowed:
        raise InvalidInput.field("priority", f"template {template.name} does not allow spot")
    check_vm_lease(project=project, lease=lease, template=template, priority=priority)
    if image.min_disk_gib > template.disk_gib:
        raise InvalidInput.field(
            "template", f"image {image.name} needs a disk of {image.min_disk_gib} GiB or more"
        )
    if image.min_memory_gib > template.memory_gib:
        raise InvalidInput.field(
            "template", f"image {image.name} needs {image.min_memory_gib} GiB of memory or more"
        )
    if image_and_name[0][0]:  # the name is taken
        raise Conflict(
            f"a VM named {name} exists in project {project.slug}", details={"name": ["taken"]}
        )
    quotas.check(
        project,
        vms=1,
        vcpus=template.vcpus,
        memory_gib=template.memory_gib,
        gpus=template.gpus,
    )
    vm = VirtualMachine(
        project=project,
        name=name,
        template=template,
        image=image,
        priority=priority,
        placement_group=placement_group,
        lease=lease,
        vcpus=template.vcpus,
        memory_mib=template.memory_gib * 1024,
        gpus=template.gpus,
        gpu_model=template.gpu_model,
        rdma_vfs=sum(nic["network"].kind == NetworkKind.RDMA for nic in nics),
        disk_gib=template.disk_gib,
        ssh_keys=list(ssh_keys),
        user_data=user_data,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    insert(vm)  # its INSERT built once (``controlplane.compiled.insert``)
    _create_ports(vm, nics)
    # Made just now: it has no volume, and no port unless it has NICs. Held as read, so
    # the placement's binding and its host's message read neither.
    prefetched(vm, "volumes", [])
    if not nics:
        prefetched(vm, "ports", [])
    operation = open_operation(vm, "vm.create", actor)
    try:
        place(vm)
    except NoValidHost as e:
        if not wait_for_capacity:
            raise Conflict(e.reason, code="no_capacity", details={"capacity": [e.reason]}) from e
        vm.state_reason, vm.updated_at = e.reason[:500], timezone.now()
        update_where(
            VirtualMachine,
            {"pk": vm.pk},
            {"state_reason": vm.state_reason, "updated_at": vm.updated_at},
        )
        log.info("vm %s pending: %s", vm.pk, e.reason)
        if priority == Priority.ON_DEMAND:
            from compute.services import spot

            # room held by spot VMs: notices now, placed after
            spot.preempt_for(vm, admitted=e.admitted)
    if vm.host_id is not None:
        # Its GPUs, read once: for its host's work (below) and for the caller's answer.
        read_devices(vm)
    audit.record(
        "vm.create",
        vm,
        project=project,
        detail={
            "template": template.name,
            "image": image.name,
            "priority": priority,
            "state": vm.state,
            "host": vm.host.name if vm.host_id else None,
            "operation": str(operation.pk),
        },
    )
    send_apply(vm, operation_id=str(operation.pk))
    return vm, operation


def _create_ports(vm: VirtualMachine, nics) -> None:
    from network import services as network

    for index, nic in enumerate(nics):
        if nic["network"].project_id != vm.project_id:
            raise InvalidInput.field("nics", "no such network in this project")
        network.port_create(
            network=nic["network"],
            vm=vm,
            fixed_ip=nic.get("fixed_ip") or "",
            security_groups=nic.get("security_groups"),
            device_index=index,
        )


# The plain spot sizes waiting, and those of them with VMs not yet told why: every pass reads
# them, compiled once (``controlplane.compiled``).
_SIZES_WAITING = Compiled(
    lambda: (
        VirtualMachine.objects.filter(QUEUED)
        .filter(PLAIN_SPOT)
        .values_list(*SIZE)
        .distinct()
        .order_by()
    )
)
_SIZES_UNTOLD = Compiled(
    lambda: (
        VirtualMachine.objects.filter(QUEUED)
        .filter(PLAIN_SPOT)
        .filter(UNTOLD)
        .values_list(*SIZE)
        .distinct()
        .order_by()
    )
)


def vm_schedule_pending(*, limit: int = 100) -> int:
    """Try to place up to ``limit`` pending VMs, oldest first; returns how many were placed.
    Each VM is placed in its own transaction, so one failure holds up no other.

    A spot VM with no placement group and no lease (a "plain" one) whose size the
    scheduler's view has no room for is neither read nor locked, and does not count against
    ``limit``: each size is decided once from the view at the start of the pass, and every
    plain spot VM of a size without room that waits for another reason is told why, in one
    statement per such size, at the end.
    So a pass over a long queue costs one decision per size, and a small spot VM is placed
    on the GPUs that are free even when a hundred 8-GPU ones that fit nowhere wait before it
    (backfilling: spot runs on whatever is free; a waiting spot VM holds no place).

    Nor does a pass read the queue whole: every read is a range of one of the queue's
    partial indexes (``VirtualMachine.Meta``), so its cost follows the sizes waiting and
    ``limit``, not the thousands of spot VMs a busy fleet keeps waiting."""
    placed = 0
    # On-demand first ("on_demand" sorts before "spot"): spot runs on what nobody else needs.
    # A VM waiting for spot evictions (``reserved_host``) is placed by the hand-over.
    pending = VirtualMachine.objects.filter(QUEUED)
    plain_spot = pending.filter(PLAIN_SPOT)
    no_room: dict[tuple, str] = {}  # a plain spot size -> why no host has room for it
    roomy: set[tuple] = set()  # plain spot sizes with room since the last attempt
    # Each plain spot size waiting, and whether one of its VMs waits for another reason
    # than want of room for it (told when they joined the queue, a VM is told that reason:
    # ``vm_create``, ``lifecycle.requeue``). Only a size with such VMs is told at the end:
    # a pass over a queue told already writes nothing and builds no statement to check it.
    untold = dict.fromkeys(_SIZES_WAITING.tuples(), False)
    untold.update(dict.fromkeys(_SIZES_UNTOLD.tuples(), True))
    # One fresh look at the hosts a pass, however many sizes find no room: the view then
    # follows every claim the pass makes (the first size without room on the kept view
    # reads the fleet again; the others are decided on that read).
    looked = False

    def why_no_room(size: tuple) -> str:
        nonlocal looked
        reason = placement.no_room(_size_request(size), look_fresh=not looked)
        looked = looked or bool(reason)
        return reason

    for size in untold:
        reason = why_no_room(size)
        if reason:
            no_room[size] = reason[:500]
        else:
            roomy.add(size)
    for queued in _queue_head(roomy, limit, no_room):
        size = tuple(getattr(queued, f) for f in SIZE)
        plain = (
            queued.priority == Priority.SPOT
            and queued.placement_group_id is None
            and queued.lease_id is None
        )
        if plain and size not in no_room and size not in roomy:
            reason = why_no_room(size)  # the last attempt took room
            if reason:
                no_room[size] = reason[:500]
        if plain and size in no_room:
            continue
        roomy.clear()  # an attempt (a claim, a preemption's reservation) changes the view
        vm = None
        try:
            with transaction.atomic():
                vm, claimed = placement.pending_claimed(queued)  # locked, and placed if it can be
                if vm is None:
                    continue  # placed, deleted, or now waiting for evictions meanwhile
                try:
                    place(vm, claimed=claimed is not None)
                except NoValidHost as e:
                    if vm.state_reason != e.reason[:500]:
                        VirtualMachine.objects.filter(pk=vm.pk).update(state_reason=e.reason[:500])
                    if plain:
                        no_room[size] = e.reason[:500]
                    if vm.priority == Priority.ON_DEMAND:
                        from compute.services import spot

                        spot.preempt_for(vm, admitted=e.admitted)
                    continue
                audit.record("vm.schedule", vm, project=vm.project, detail={"host": vm.host.name})
                send_apply(vm, operation_id=current_operation(vm))
                placed += 1
        except Conflict as e:
            _refused_in_pass(queued, vm, e)
    for size, reason in no_room.items():
        if not untold.get(size, True):  # (a size not read at the start: one queued meanwhile)
            continue
        # Told once: a VM already waiting for want of room for its size keeps the reason it
        # was told, though the counts in it (hosts up, hosts turned away) move with claims,
        # releases and hand-overs. Rewriting them at every move would write every row of a
        # long queue at every pass.
        plain_spot.filter(UNTOLD, **_of_size(size)).update(state_reason=reason)
    return placed


def _refused_in_pass(queued: placement.Queued, vm: VirtualMachine | None, refusal: Conflict):
    """A VM the pass could not place (its RDMA port found no free virtual function on the
    host its claim went to): its transaction rolled back, claim and all. It waits with the
    reason and the pass goes on with the others. The host this process's view reserved for
    the claim (``vm``, as the claim left it in memory) is read again."""
    log.warning("vm %s: not placed in this pass: %s", queued.pk, refusal.message)
    VirtualMachine.objects.filter(pk=queued.pk, state=VmState.PENDING).update(
        state_reason=f"waiting: {refusal.message}"[:500]
    )
    if vm is None or vm.host_id is None:  # refused before a claim: the view holds none
        return
    with placement.view.lock:
        placement.view.refresh_host(vm.host_id)


def _queue_head(
    roomy: set[tuple], limit: int, no_room: dict[tuple, str]
) -> Iterator[placement.Queued]:
    """The first ``limit`` VMs of the queue, on-demand first, then oldest first, that a pass
    may try: all but the plain spot VMs of the sizes without room. Read as ranges of the
    queue's indexes, merged: the VMs that are not plain spot ones (``vm_queue``), and the
    plain spot VMs of each size with ``roomy`` (``vm_queue_spot``).

    Each range is read a page at a time as the pass comes to it (``_pages``), and a plain
    spot size's range stops once the pass finds no room for that size (``no_room``, which
    the pass fills as it goes): a pass mostly places the first few VMs of a size, and the
    rest of a long queue of that size is neither read nor counted against ``limit``."""
    ranges = [_pages(lambda page: _queue_range(page, plain=False).tuples(), limit)]
    ranges += [
        _pages(
            lambda page, size=size: _queue_range(page, plain=True).tuples(*size),
            limit,
            until=lambda size=size: size in no_room,
        )
        for size in sorted(roomy)
    ]
    priority = placement.Queued._fields.index("priority")
    merged = heapq.merge(*ranges, key=lambda row: (row[priority], row[-1]))
    for row in itertools.islice(merged, limit):
        yield placement.Queued._make(row[:-1])


# The rows of a queue range a pass reads first, then four times as many each time it needs
# more: most passes place a VM or two of a range.
_FIRST_PAGE = 8


#: A queue range's row: the pass's (``placement.Queued``) and the VM's age.
_QUEUE_FIELDS = (*placement.Queued._fields, "created_at")
#: The queue's ranges (``_queue_range``), compiled once for each page size.
_RANGES: dict[tuple[int, bool], Compiled] = {}


def _queue_range(page: int, *, plain: bool) -> Compiled:
    """The first ``page`` rows of a range of the queue, as a compiled read: the VMs that are
    not plain spot ones, on-demand first then oldest (of no values), or the plain spot VMs
    of one size, oldest first (of the size's values, ``SIZE``)."""
    read = _RANGES.get((page, plain))
    if read is None:
        queue = VirtualMachine.objects.filter(QUEUED)
        if plain:
            read = Compiled(
                lambda *size: (
                    queue.filter(PLAIN_SPOT, **_of_size(size))
                    .order_by("created_at")
                    .values_list(*_QUEUE_FIELDS)[:page]
                ),
                *(value_kind(VirtualMachine, name) for name in SIZE),
            )
        else:
            read = Compiled(
                lambda: (
                    queue.filter(~PLAIN_SPOT)
                    .order_by("priority", "created_at")
                    .values_list(*_QUEUE_FIELDS)[:page]
                )
            )
        _RANGES[page, plain] = read
    return read


def _pages(read, limit: int, *, until=lambda: False) -> Iterator[tuple]:
    """The rows of a queue range, ``read(size)`` its first ``size`` rows in its order, read a
    page at a time as they are asked for, each page whole before its first row is used (the
    pass's claims write the rows it holds). A page is read from the range's start again,
    bigger: the rows the pass tried are gone from it (placed) or given already (still
    waiting), and are left out. No page is longer than ``limit``, the most a pass takes.
    Stops when ``until()`` says so, or the range has no more rows."""
    given: set = set()
    size = min(_FIRST_PAGE, limit)
    while not until():
        rows = read(size)
        for row in rows:
            if row[0] not in given:
                given.add(row[0])
                yield row
        if len(rows) < size or size == limit:
            return
        size = min(size * 4, limit)


def _of_size(size: tuple) -> dict:
    """A size (``SIZE``) as the fields it stands for."""
    return dict(zip(SIZE, size, strict=True))


def _size_request(size: tuple) -> Request:
    return Request(**_of_size(size))


# --- actions on a VM ---------------------------------------------------------------------------


def _act(
    vm: VirtualMachine, action: str, actor, *, locked: bool = False, **changes
) -> tuple[VirtualMachine, Operation]:
    guard(vm if locked else lock(vm), action)
    vm = transition(vm, **changes)
    operation = open_operation(vm, f"vm.{action}", actor)
    audit.record(f"vm.{action}", vm, project=vm.project, detail={"operation": str(operation.pk)})
    send_apply(vm, operation_id=str(operation.pk))
    return vm, operation


@transaction.atomic
def vm_start(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """stopped → running (task ``starting`` until the host reports it running); an evicted
    spot VM claims room again (``compute.services.spot.vm_start_evicted``)."""
    require_active(vm.project)
    if vm.state == VmState.EVICTED:
        from compute.services import spot

        return spot.vm_start_evicted(vm=vm, actor=actor)
    if vm.state == VmState.SHELVED:
        from compute.services import shelve

        return shelve.vm_unshelve(vm=vm, actor=actor)
    return _act(vm, "start", actor, task_state=VmTask.STARTING)


@transaction.atomic
def vm_stop(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """running → stopped: the guest is asked to shut down, and forced off after
    ``KUMO_VM_STOP_GRACE_S``."""
    return _act(vm, "stop", actor, task_state=VmTask.STOPPING)


@transaction.atomic
def vm_reboot(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """One graceful power cycle of a running VM."""
    return _act(vm, "reboot", actor, task_state=VmTask.REBOOTING)


@transaction.atomic
def vm_reset(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """Hard-reset a running VM (the reset button): it reboots at once, its OS not asked.
    Allowed while a graceful reboot hangs."""
    return _act(vm, "reset", actor, task_state=VmTask.RESETTING)


@transaction.atomic
def vm_power_off(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """running → stopped at once, its OS not asked (pulling the plug; libvirt
    ``destroy``). Allowed while a graceful stop or reboot hangs."""
    return _act(vm, "power_off", actor, task_state=VmTask.POWERING_OFF)


@transaction.atomic
def vm_console_log(*, vm: VirtualMachine, max_bytes: int, actor=None) -> Operation:
    """Ask the VM's host for the last ``max_bytes`` (at most 64 KiB) of the guest's serial
    console; the answer is the operation's result (``output``). 409 when the VM has no
    host (never placed, or deleted)."""
    if vm.host_id is None or vm.state in (VmState.DELETED, VmState.PENDING):
        raise Conflict(
            f"vm {vm.name} is {vm.state} and has no console on any host",
            code="invalid_state",
            details={"state": [vm.state]},
        )
    operation = operation_create(
        kind="vm.console_log", target=vm, project=vm.project, created_by=actor, deadline_s=60
    )
    agents.send_to_host(
        vm.host.name,
        VM_CONSOLE_LOG_TASK,
        vm_id=str(vm.pk),
        operation_id=str(operation.pk),
        max_bytes=min(max_bytes, CONSOLE_LOG_MAX_BYTES),
    )
    return operation


@transaction.atomic
def vm_delete(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """Delete from any live state. A VM that was never placed is gone at once; a placed one
    is deleting until its host reports the guest absent, and only then gives back its
    host's capacity and GPUs, so nothing is handed out while the guest may still hold it."""
    guard(lock(vm), "delete")
    from network import services as network

    # The ports go now, not when the guest is gone: its NAT and forwards stop at once and
    # its tap leaves the bridge, so nothing reaches it while its host tears it down.
    network.ports_release(vm)
    from storage import services as storage

    detached = storage.volumes_release(vm)  # each detach re-applies the VM: a new generation
    if vm.host_id is None:
        if vm.kept_disk:
            from compute.services import shelve

            shelve.kept_disk_remove(vm)
        vm = transition(
            vm, state=VmState.DELETED, task_state=VmTask.NONE, deleted_at=timezone.now()
        )
        pending = current_operation(vm)
        if pending:
            operation_finish(
                operation_id=pending,
                ok=False,
                error_code="deleted",
                error_message="the VM was deleted before it was placed",
                project=vm.project,
            )
        supersede_operations(vm, by="deleted before it was placed")
        operation = open_operation(vm, "vm.delete", actor)
        audit.record("vm.delete", vm, project=vm.project, detail={"operation": str(operation.pk)})
        operation_finish(
            operation_id=operation.pk, ok=True, result={"state": vm.state}, project=vm.project
        )
        operation.refresh_from_db()
        return vm, operation
    supersede_operations(vm, by="deleted by a delete request")
    return _act(
        vm, "delete", actor, locked=not detached, state=VmState.DELETING, task_state=VmTask.NONE
    )


def vm_finish_delete(vm: VirtualMachine) -> None:
    """deleting → deleted, giving back the host's capacity and the VM's GPUs. Call inside
    the transaction holding the VM's row lock (and its host's, which a victim of spot
    evictions deleted during its notice needs: its waiter takes the room now)."""
    placement.release(vm)
    now = timezone.now()
    update_where(
        VirtualMachine,
        {"pk": vm.pk},
        {"state": VmState.DELETED, "task_state": VmTask.NONE, "deleted_at": now, "updated_at": now},
    )
    vm.state = VmState.DELETED
    usage.vm_usage_sync(vm, at=now)
    audit.record("vm.deleted", vm, project=vm.project)
    if vm.evicted_for_id is not None and vm.host_id is not None:
        from compute.services import spot

        spot.victim_gone(vm, vm.host)
