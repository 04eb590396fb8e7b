"""OpenAPI schema generation: Kumo's authentication and path conventions."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

PROJECT_SLUG = OpenApiParameter(
    "project_slug",
    str,
    OpenApiParameter.PATH,
    description="The project's slug. A project you hold no role in answers 404.",
    pattern=r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$",
)


class KumoAutoSchema(AutoSchema):
    def get_override_parameters(self):
        params = list(super().get_override_parameters())
        if "{project_slug}" in self.path:
            params.append(PROJECT_SLUG)
        return params


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `Authorization: Bearer kumo_…`",
        }
