from django.apps import AppConfig


class StorageConfig(AppConfig):
    name = "storage"
    verbose_name = "Storage"

    def ready(self):
        from controlplane import agents
        from storage import protocol, quotas, services

        agents.register_report(protocol.SHARE_APPLIED_REPORT, services.share_reported)
        quotas.register()
