"""The SDK against a live Kumo (gunicorn on the test database): pagination, retries that
never create twice, errors mapped from the error body, waiting on operations, tokens."""

import threading
import time
import uuid

import httpx
import pytest
from django.db import connection
from kumo_sdk import (
    AuthenticationFailed,
    Client,
    Conflict,
    ConnectionFailed,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidState,
    NotFound,
    OperationFailed,
    OperationTimeout,
    PermissionDenied,
    QuotaExceeded,
    ServerError,
    mint_token,
)
from kumo_sdk.types import Network, VirtualMachine

from compute.models import Template
from controlplane.services import operation_finish
from network.models import Network as NetworkRow
from tenants import services as tenants
from tenants.choices import Role
from tests.e2e.processes import free_port
from tests.factories import add_member, make_image, make_project, make_template, token_for
from tests.sdk.conftest import PASSWORD, can_log_in

pytestmark = pytest.mark.e2e


class Recorder(httpx.HTTPTransport):
    """A real transport that records each exchange, and can spoil chosen ones: ``faults``
    maps the number of a POST (1 = the first) to what goes wrong with it."""

    def __init__(self, faults: dict[int, str] | None = None):
        super().__init__()
        self.faults = faults or {}
        self.exchanges: list[dict] = []
        self.posts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        fault = None
        if request.method == "POST":
            self.posts += 1
            fault = self.faults.get(self.posts)
        seen = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "key": request.headers.get("Idempotency-Key"),
        }
        self.exchanges.append(seen)
        if fault == "503 before the server":
            seen["status"] = 503
            return httpx.Response(503, headers={"Retry-After": "0"}, text="unavailable")
        response = super().handle_request(request)
        response.read()
        seen["status"] = response.status_code
        seen["replayed"] = response.headers.get("Idempotent-Replayed")
        if fault == "reset after the server":
            raise httpx.ReadError("connection reset by peer", request=request)
        if fault == "502 after the server":
            return httpx.Response(502, text="<html>bad gateway</html>")
        return response


def client(server, user, project, transport=None, **options) -> Client:
    return Client(
        server.url,
        token_for(user),
        project=project.slug,
        backoff=0,
        transport=transport,
        **options,
    )


# --- pagination -------------------------------------------------------------------------------


def test_list_iterates_every_page_in_order(server, owner, project):
    for _ in range(7):
        make_template()
    names = sorted(Template.objects.filter(active=True).values_list("name", flat=True))
    recorder = Recorder()
    with client(server, owner, project, recorder) as kumo:
        listed = [t.name for t in kumo.templates.list(page_size=3, ordering="name")]
    assert listed == names and len(names) >= 7
    pages = [e["query"] for e in recorder.exchanges]
    assert len(pages) == -(-len(names) // 3)
    assert all(b"page_size=3" in q for q in pages)


# --- retries: a POST is done once, whatever happens to its answer -------------------------------


@pytest.mark.parametrize(
    "fault", ["reset after the server", "502 after the server", "503 before the server"]
)
def test_a_retried_post_creates_once(server, owner, project, fault):
    recorder = Recorder(faults={1: fault})
    with client(server, owner, project, recorder) as kumo:
        network = kumo.networks.create("lab-net", cidr="10.1.0.0/24")
    assert isinstance(network, Network) and network.name == "lab-net"
    rows = NetworkRow.objects.filter(project=project, name="lab-net")
    assert [str(r.pk) for r in rows] == [network.id]

    first, retry = recorder.exchanges
    assert first["key"] == retry["key"] and first["key"]
    assert retry["status"] == 201
    # The server did the first one: the retry was replayed, not done again.
    assert retry["replayed"] == ("true" if fault.endswith("after the server") else None)


def test_each_post_has_its_own_key_and_a_key_cannot_be_reused_for_another_request(kumo):
    kumo.networks.create("one")
    kumo.networks.create("two", idempotency_key="k-1")
    again = kumo.networks.create("two", idempotency_key="k-1")  # a deliberate retry
    assert sorted(n.name for n in kumo.networks.list()) == ["one", "two"]
    assert again.name == "two"
    with pytest.raises(IdempotencyKeyReused) as e:
        kumo.networks.create("three", idempotency_key="k-1")
    assert e.value.status == 422 and "Idempotency-Key" in e.value.details


def test_retries_give_up_with_the_last_answer_or_error(server, owner, project):
    class Always504(httpx.BaseTransport):
        calls = 0

        def handle_request(self, request):
            Always504.calls += 1
            return httpx.Response(504, text="gateway timeout")

    kumo = client(server, owner, project, Always504(), retries=2)
    with kumo, pytest.raises(ServerError) as e:
        list(kumo.networks.list())
    assert Always504.calls == 3 and e.value.status == 504 and "gateway timeout" in e.value.message

    dead = Client(f"http://127.0.0.1:{free_port()}", "kumo_x", retries=1, backoff=0)
    with pytest.raises(ConnectionFailed):
        dead.whoami()


# --- errors -------------------------------------------------------------------------------------


def test_errors_map_to_exceptions_with_code_and_details(server, kumo, owner, project):
    with pytest.raises(NotFound) as e:
        kumo.networks.get(str(uuid.uuid4()))
    assert (e.value.status, e.value.code) == (404, "not_found")

    other = make_project()  # another tenant's network reads as missing, exactly
    with client(server, other.owner, other) as theirs:
        hidden = theirs.networks.create("hidden")
    with pytest.raises(NotFound):
        kumo.networks.get(hidden.id)

    kumo.networks.create("dup")
    with pytest.raises(Conflict) as e:
        kumo.networks.create("dup")
    assert e.value.status == 409 and e.value.details == {"name": ["taken"]}

    with pytest.raises(InvalidInput) as e:
        kumo.networks.create("Not_A_Hostname", cidr="10.0.0.0/30")
    assert e.value.status == 400 and e.value.code == "invalid"
    assert set(e.value.fields) == {"name"}
    with pytest.raises(InvalidInput) as e:
        kumo.networks.create("small", cidr="10.0.0.0/30")
    assert e.value.fields == ["cidr"] and "/29" in e.value.message

    tenants.quota_set(project=project, networks=1)
    with pytest.raises(QuotaExceeded) as e:
        kumo.networks.create("one-too-many")
    assert isinstance(e.value, Conflict) and e.value.code == "quota_exceeded"

    reader = add_member(project, role=Role.READER)
    with client(server, reader, project) as theirs, pytest.raises(PermissionDenied) as e:
        theirs.networks.create("nope")
    assert "reader" in e.value.message

    with pytest.raises(AuthenticationFailed) as e:
        Client(server.url, "kumo_0000_not-a-token", backoff=0).whoami()
    assert e.value.status == 401


def test_an_action_the_vm_state_forbids_is_invalid_state_naming_it(kumo):
    vm = kumo.vms.create("idle", template=make_template().name, image=make_image().pk)
    assert vm.state == "pending" and vm.operation  # no hosts: it waits for capacity
    with pytest.raises(InvalidState) as e:
        kumo.vms.stop(vm.id)
    assert e.value.details["state"] == ["pending"]
    assert kumo.vms.find("idle").id == vm.id


# --- operations ---------------------------------------------------------------------------------


def _finish_later(operation_id: str, **outcome) -> threading.Thread:
    """What a host's report does, from another thread after a moment."""

    def finish():
        time.sleep(0.6)
        try:
            operation_finish(operation_id=operation_id, **outcome)
        finally:
            connection.close()

    thread = threading.Thread(target=finish)
    thread.start()
    return thread


def test_waiting_on_an_operation(kumo):
    template, image = make_template().name, make_image().pk
    vm = kumo.vms.create("waiting", template=template, image=image)
    start = time.monotonic()
    with pytest.raises(OperationTimeout) as e:
        kumo.operations.wait(vm.operation, timeout=1)
    assert 1 <= time.monotonic() - start < 8  # the timeout, and one last look
    assert e.value.operation.state == "pending" and e.value.operation.kind == "vm.create"

    states = []
    op_id = e.value.operation.id
    _finish_later(op_id, ok=True, result={"host": "cpu-09"})
    done = kumo.operations.wait(op_id, timeout=10, on_poll=lambda op: states.append(op.state))
    assert done.state == "succeeded" and done.result == {"host": "cpu-09"}
    assert states[0] == "pending" and states[-1] == "succeeded"

    other = kumo.vms.create("failing", template=template, image=image)
    _finish_later(
        kumo.operations.get(other.operation).id,
        ok=False,
        error_code="host_error",
        error_message="the hypervisor refused the domain",
    )
    with pytest.raises(OperationFailed) as e:
        kumo.operations.wait(other.operation, timeout=10)
    assert e.value.operation.error_code == "host_error"
    assert "the hypervisor refused the domain" in str(e.value)


# --- tokens and typed results -------------------------------------------------------------------


def test_login_mints_a_token_that_works_and_revoking_it_ends_it(server, owner, project):
    can_log_in(owner)
    token = mint_token(server.url, owner.username, PASSWORD, name="laptop", project=project.slug)
    assert token.token.startswith("kumo_") and token.project == project.slug
    with Client(server.url, token.token, backoff=0) as kumo:
        assert kumo.whoami().username == owner.username
        assert [p.slug for p in kumo.projects.list()] == [project.slug]
        listed = {t.id: t for t in kumo.tokens.list()}
        assert listed[token.id].token is None  # the secret is never shown again
        kumo.tokens.revoke(token.id)
        with pytest.raises(AuthenticationFailed):
            kumo.whoami()

    with pytest.raises(AuthenticationFailed) as e:
        mint_token(server.url, owner.username, "wrong", name="x")
    assert e.value.code == "invalid_credentials"


def test_results_are_typed(kumo, project):
    template, image = make_template(), make_image()
    assert kumo.templates.get(template.name) == template_of(kumo, template.name)
    assert kumo.images.get(image.pk).name == image.name
    kumo.networks.create("lab", cidr="10.5.0.0/24")
    vm = kumo.vms.create("typed", template=template.name, image=image.pk, networks=["lab"])
    assert isinstance(vm, VirtualMachine) and vm.vcpus == template.vcpus
    assert vm.created_at.tzinfo is not None and vm.raw["name"] == "typed"
    [nic] = vm.nics
    port = kumo.ports.get(nic.port)
    assert (port.vm, port.network, port.fixed_ips) == (vm.id, "lab", nic.fixed_ips)
    assert [p.id for p in kumo.ports.list()] == [port.id]

    subnet = kumo.subnets.create("lab", "10.6.0.0/24")
    assert sorted(s.cidr for s in kumo.subnets.list()) == ["10.5.0.0/24", "10.6.0.0/24"]
    kumo.subnets.delete(subnet.id)
    assert [s.cidr for s in kumo.subnets.list()] == ["10.5.0.0/24"]

    group = kumo.security_groups.create("ssh")
    rule = kumo.security_groups.add_rule("ssh", direction="ingress", protocol="tcp", port_min=22)
    assert kumo.security_groups.find("ssh").rules == [rule]
    assert (rule.port_min, rule.port_max, rule.group) == (22, 22, "ssh")
    kumo.security_groups.delete(group.id)
    assert "ssh" not in {g.name for g in kumo.security_groups.list()}

    [fetched] = kumo.projects.list()
    assert fetched.slug == project.slug and fetched.my_role == "owner"


def template_of(kumo, name):
    return next(t for t in kumo.templates.list() if t.name == name)


# --- storage and billing ----------------------------------------------------------------------


def test_volumes_create_attach_extend_detach_delete(kumo, project):
    from compute.choices import VmState
    from compute.models import VirtualMachine as VmRow
    from tests.factories import make_host

    tenants.quota_set(project=project, storage_gib=100)
    volume = kumo.volumes.create("scratch", size_gib=10, description="data")
    assert (volume.name, volume.size_gib, volume.state, volume.tier) == (
        "scratch", 10, "available", "shared",
    )  # fmt: skip
    assert kumo.volumes.find("scratch") == volume and kumo.volumes.find(volume.id) == volume
    with pytest.raises(Conflict) as taken:
        kumo.volumes.create("scratch", size_gib=1)
    assert taken.value.details == {"name": ["taken"]}
    with pytest.raises(QuotaExceeded):
        kumo.volumes.create("huge", size_gib=1000)

    # A VM placed on a host (no agent: the database says where it runs).
    vm = kumo.vms.create("disk-vm", template=make_template().name, image=make_image().pk)
    with pytest.raises(Conflict):  # still pending: volumes attach to placed VMs
        kumo.volumes.attach(volume.id, vm.id)
    VmRow.objects.filter(pk=vm.id).update(state=VmState.RUNNING, host=make_host())
    attached = kumo.volumes.attach(volume.id, vm.id)
    assert (attached.state, attached.vm, attached.device) == ("in_use", vm.id, "vdb")
    assert attached.guest_path.startswith("/dev/disk/by-id/virtio-")
    with pytest.raises(Conflict) as in_use:  # attached: not deleted
        kumo.volumes.delete(volume.id)
    assert in_use.value.code == "in_use"

    assert kumo.volumes.extend(volume.id, 20).size_gib == 20
    assert [v.id for v in kumo.volumes.list(state="in_use")] == [volume.id]
    detached = kumo.volumes.detach(volume.id)
    assert (detached.state, detached.vm) == ("available", None)
    kumo.volumes.delete(volume.id)
    assert list(kumo.volumes.list()) == []
    with pytest.raises(NotFound):
        kumo.volumes.find("scratch")


def test_buckets_and_access_keys(kumo, project):
    tenants.quota_set(project=project, buckets=2)
    name = f"sdk-{uuid.uuid4().hex[:12]}"
    bucket = kumo.buckets.create(name, quota_gib=5)
    assert (bucket.name, bucket.quota_gib, bucket.project) == (name, 5, project.slug)
    assert bucket.endpoint.startswith("http://127.0.0.1:")
    assert [b.name for b in kumo.buckets.list()] == [name] and kumo.buckets.get(name) == bucket

    key = kumo.access_keys.create(description="laptop")
    assert key.secret_access_key and key.endpoint == bucket.endpoint
    [listed] = kumo.access_keys.list()
    assert (listed.id, listed.access_key_id, listed.secret_access_key) == (
        key.id, key.access_key_id, None,
    )  # fmt: skip
    assert "secret_access_key" not in listed.raw
    assert kumo.access_keys.find(key.access_key_id).id == key.id
    kumo.access_keys.delete(key.id)
    assert list(kumo.access_keys.list()) == []

    kumo.buckets.delete(name)
    assert list(kumo.buckets.list()) == []
    with pytest.raises(NotFound):
        kumo.buckets.get(name)


def issue_invoice(project):
    """A rate card, ten vCPU-hours in January 2025, and that month's invoice, issued."""
    from datetime import UTC, date, datetime, timedelta

    from tenants import billing, usage

    class Subject:
        class _meta:
            label_lower = "tests.subject"

        def __init__(self, project, pk):
            self.project_id, self.pk = project.pk, pk

        def __str__(self):
            return f"subject {self.pk}"

    billing.rate_card_create(
        valid_from=datetime(2025, 1, 1, tzinfo=UTC),
        prices=[
            {"resource": resource, "unit_price": "10"}
            for resource in ("vcpu", "memory", "gpu", "storage", "global_ip")
        ],
    )
    start = datetime(2025, 1, 1, tzinfo=UTC)
    subject = Subject(project, "train-1")
    usage.usage_open(subject, "vcpu", 1, start)
    usage.usage_close(subject, "vcpu", at=start + timedelta(hours=10))
    usage.usage_open(Subject(project, "still-running"), "vcpu", 2, start + timedelta(days=3))
    [invoice] = billing.invoices_issue(period=date(2025, 1, 1), projects=[project])
    return invoice


def test_usage_invoices_and_forecast(kumo, project):
    import json
    from datetime import UTC, date, datetime

    invoice = issue_invoice(project)
    records = list(kumo.usage.list(ordering="started_at"))
    assert [(r.resource, r.subject_id, r.ended_at is None) for r in records] == [
        ("vcpu", "train-1", False),
        ("vcpu", "still-running", True),
    ]
    [still] = kumo.usage.list(open=True)
    assert still.subject_id == "still-running" and float(still.quantity) == 2
    after = datetime(2025, 1, 2, tzinfo=UTC)
    assert [r.subject_id for r in kumo.usage.list(started_after=after)] == ["still-running"]
    assert list(kumo.usage.list(resource="gpu")) == []

    [listed] = kumo.invoices.list()
    assert (listed.id, listed.period_start, listed.content_hash) == (
        invoice.pk, date(2025, 1, 1), invoice.content_hash,
    )  # fmt: skip
    assert kumo.invoices.get(invoice.pk) == listed
    document = kumo.invoices.download(invoice.pk, format="json")
    assert document == invoice.document.encode()
    assert json.loads(document)
    csv = kumo.invoices.download(invoice.pk).decode()
    assert csv.splitlines()[0] and "vcpu" in csv
    with pytest.raises(ValueError):
        kumo.invoices.download(invoice.pk, format="pdf")
    with pytest.raises(NotFound):
        kumo.invoices.download(invoice.pk + 1000)

    forecast = kumo.usage.forecast()
    assert forecast.period_start.day == 1 and forecast.period_end > forecast.period_start
    assert float(forecast.projected) >= float(forecast.so_far) > 0  # the open interval
    assert [line.resource for line in forecast.lines] == ["vcpu"]
