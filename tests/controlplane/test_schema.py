"""The OpenAPI document (/api/schema/) is valid OpenAPI and says what the server enforces;
the API docs page (/api/docs/) loads nothing from outside Kumo."""

import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_docs_page_loads_only_local_assets():
    client = Client()
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert not re.search(r"https?://", html.replace("http://testserver", "")), html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    scripts = [a for a in assets if a.endswith(".js")]
    assert any("swagger-ui-bundle" in a for a in scripts), assets
    for asset in assets:
        assert asset.startswith("/"), asset  # same origin
        response = client.get(asset)
        assert response.status_code == 200, asset
        body = b"".join(response.streaming_content) if response.streaming else response.content
        response.close()
        assert body, asset


@pytest.fixture(scope="module")
def document(django_db_blocker):
    with django_db_blocker.unblock():
        answer = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert answer.status_code == 200
    return answer.json()


def test_the_document_is_valid_openapi(document):
    from openapi_spec_validator import validate

    validate(document)  # raises on the first error: every default obeys its own schema too


def _props(document, component):
    return document["components"]["schemas"][component]["properties"]


def test_the_document_states_what_the_server_enforces(document):
    assert _props(document, "SecurityGroupRequest")["name"]["pattern"].startswith("^[a-z0-9]")
    assert _props(document, "VirtualMachineCreateRequest")["nics"]["maxItems"] == 8
    amount = re.compile(_props(document, "BudgetRequest")["amount"]["pattern"])
    assert amount.match("0.5") and amount.match("120")
    assert not any(amount.match(v) for v in ("0", "0.000", "-5", ""))
    nul_free = re.compile(
        _props(document, "VirtualMachineCreateRequest")["ssh_keys"]["items"]["pattern"]
    )
    assert nul_free.match("my-key") and not nul_free.match("my\x00key")
    assert "pattern" in _props(document, "WebhookCreateRequest")["kinds"]["items"]
    create = document["paths"]["/api/v1/projects/{project_slug}/vms/"]["post"]
    accepted = create["responses"]["202"]
    assert "Location" in accepted["headers"]
    body = accepted["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert "operation" in document["components"]["schemas"][body]["properties"]


def test_the_vm_create_answer_is_what_the_document_says(client_for, project):
    from tests.factories import make_image, make_template

    answer = client_for(project.owner).post(
        f"/api/v1/projects/{project.slug}/vms/",
        {"name": "doc", "template": make_template().name, "image": make_image().pk},
        format="json",
    )
    assert answer.status_code == 202
    assert answer["Location"] == answer.json()["url"]
    assert "/operations/" in answer.json()["operation"]


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("networks", "external_access", {"name": "n1", "external_access": 0}),
        ("networks", "external_access", {"name": "n1", "external_access": "false"}),
        ("ports", "port_security", {"network": "n1", "port_security": 0}),
        (
            "vms",
            "wait_for_capacity",
            {"name": "v", "template": "t", "image": 1, "wait_for_capacity": 1},
        ),
    ],
)
def test_booleans_are_json_booleans(client_for, project, path, field, body):
    answer = client_for(project.owner).post(
        f"/api/v1/projects/{project.slug}/{path}/", body, format="json"
    )
    assert answer.status_code == 400 and field in answer.json()["details"], answer.json()


@pytest.mark.parametrize("value", ["null", "", "yes", "0"])
def test_an_unreadable_open_filter_is_refused_not_ignored(client_for, project, value):
    answer = client_for(project.owner).get(
        f"/api/v1/projects/{project.slug}/usage-records/", {"open": value}
    )
    if value == "":
        assert answer.status_code in (200, 400)  # an empty value: no filter, or refused
    else:
        assert answer.status_code == 400 and "open" in answer.json()["details"]
    assert (
        client_for(project.owner)
        .get(f"/api/v1/projects/{project.slug}/usage-records/", {"open": "true"})
        .status_code
        == 200
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/projects/{slug}/vms/",
        "/api/v1/projects/no-such-project/vms/",  # was 404: the project lookup came first
        "/api/v1/user/tokens/",
        "/api/v1/nothing-here/",
        "/healthz",  # was 200: a plain Django view answers TRACE like GET
        "/",
    ],
)
def test_trace_is_not_allowed_anywhere(client_for, project, path):
    for client in (client_for(project.owner), client_for()):
        answer = client.generic("TRACE", path.format(slug=project.slug))
        assert answer.status_code == 405 and answer.json()["code"] == "method_not_allowed"
