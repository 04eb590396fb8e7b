"""OpenAPI schema generation: Kumo's authentication and path conventions."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from controlplane.api import idempotency
from controlplane.api.errors import ErrorSerializer

PROJECT_SLUG = OpenApiParameter(
    "project_slug",
    str,
    OpenApiParameter.PATH,
    description="The project's slug. A project you hold no role in answers 404.",
    pattern=r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$",
)


# What controlplane/api/idempotency.py accepts: printable (str.isprintable) Latin-1, and HTTP
# drops the whitespace around a header's value.
_PRINTABLE, _VISIBLE = r"\x20-\x7e\xa1-\xac\xae-\xff", r"\x21-\x7e\xa1-\xac\xae-\xff"
IDEMPOTENCY_KEY = OpenApiParameter(
    idempotency.HEADER,
    {
        "type": "string",
        "minLength": 1,
        "maxLength": idempotency.MAX_KEY_LENGTH,
        "pattern": f"^[{_VISIBLE}]([{_PRINTABLE}]*[{_VISIBLE}])?$",
    },
    OpenApiParameter.HEADER,
    description="Retrying a POST with the same key replays the first successful response "
    "instead of doing the work twice; the same key on another request answers 422.",
)

# Every 202 (accepted: the work goes on) names where to follow it.
LOCATION_HEADER = OpenApiParameter(
    "Location",
    str,
    OpenApiParameter.HEADER,
    response=[202],
    description="The URL of what was accepted: the object being made (a VM create) or the "
    "operation to follow (other actions).",
)

WRITES = ("POST", "PUT", "PATCH", "DELETE")

# Text in a JSON list never holds a NUL character (PostgreSQL text cannot; the server
# refuses it): said in the schema of every list of plain strings (postprocess_no_nul).
NO_NUL = "^[^\\u0000]*$"


def postprocess_no_nul(result, generator, request, public):
    """Items of request lists that are plain strings get ``pattern: NO_NUL``."""

    def visit(node):
        if isinstance(node, dict):
            items = node.get("items")
            if (
                node.get("type") == "array"
                and isinstance(items, dict)
                and items.get("type") == "string"
                and not ({"pattern", "enum", "format"} & items.keys())
            ):
                items["pattern"] = NO_NUL
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            visit(component)
    return result


ERRORS = {
    400: "Malformed input; ``details`` names the fields.",
    401: "No credential, or a bad one.",
    403: "Not allowed: a role too low, or an operators' endpoint.",
    404: "No such object, or one in a project you hold no role in; or a page past the end.",
    409: "The object's state forbids this.",
    422: "This Idempotency-Key was used for another request.",
}


class KumoAutoSchema(AutoSchema):
    def get_override_parameters(self):
        params = list(super().get_override_parameters())
        if "{project_slug}" in self.path:
            params.append(PROJECT_SLUG)
        if self.method == "POST" and self._authenticated():
            params.append(IDEMPOTENCY_KEY)
        if self.method == "POST" and self._accepted():
            params.append(LOCATION_HEADER)
        return params

    def _accepted(self) -> bool:
        """Whether the operation answers 202 (its ``extend_schema`` responses say so)."""
        responses = self.get_response_serializers()
        return isinstance(responses, dict) and any(str(code) == "202" for code in responses)

    def _authenticated(self) -> bool:
        return {} not in self.get_auth()

    def _error_statuses(self) -> set[int]:
        """The errors this operation can answer, all in the one format (controlplane.api.errors):
        - 400: a malformed body, Idempotency-Key header, filter or page size;
        - 401, 403: no or a bad credential, a role too low, staff only;
        - 404: an object in the path, or a page past the end of a list;
        - 409: a write the object's state forbids; 422: an Idempotency-Key reused."""
        statuses = set()
        is_list = self._is_list_view()
        paged = is_list and self._get_paginator() is not None
        filtered = is_list and getattr(self.view, "filterset_class", None) is not None
        if self.method in WRITES or paged or filtered:
            statuses.add(400)
        if self._authenticated():
            statuses |= {401, 403}
            if self.method in WRITES:
                statuses.add(409)
            if self.method == "POST":
                statuses.add(422)
        if "{" in self.path or paged:
            statuses.add(404)
        return statuses

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for status in sorted(self._error_statuses()):
            if str(status) not in responses:
                error = OpenApiResponse(ErrorSerializer, description=ERRORS[status])
                responses[str(status)] = self._get_response_for_code(
                    error, str(status), direction=direction
                )
        return responses


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `Authorization: Bearer kumo_…`",
        }
