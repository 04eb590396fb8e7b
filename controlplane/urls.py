from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane import health
from tenants.federation import oidc, saml

handler404 = "controlplane.api.errors.json_404"
handler500 = "controlplane.api.errors.json_500"

urlpatterns = [
    path("api/v1/", include(("controlplane.api.urls", "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("saml2/login/", saml.LoginView.as_view(), name="saml2_login"),
    path("saml2/acs/", saml.AssertionConsumerServiceView.as_view(), name="saml2_acs"),
    path("saml2/metadata/", saml.MetadataView.as_view(), name="saml2_metadata"),
    path("oidc/<slug:name>/login/", oidc.login, name="oidc-login"),
    path("oidc/<slug:name>/callback/", oidc.callback, name="oidc-callback"),
    # The portal's language switch posts to set_language, which remembers it in a cookie.
    path("i18n/", include("django.conf.urls.i18n")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("django_prometheus.urls")),
    path("", include("controlplane.portal.urls")),
]

admin.site.site_header = "Kumo operations"
admin.site.site_title = "Kumo admin"
admin.site.index_title = "Research cloud control plane"
