from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Projects and identity"

    def ready(self):
        from tenants import receivers  # noqa: F401  (audits logins)
