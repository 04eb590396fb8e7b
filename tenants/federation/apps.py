from django.apps import AppConfig


class FederationConfig(AppConfig):
    name = "tenants.federation"
    label = "federation"
    verbose_name = "Federated login"
    default_auto_field = "django.db.models.BigAutoField"
