from django.apps import AppConfig


class NetworkConfig(AppConfig):
    name = "network"
    verbose_name = "Network"

    def ready(self):
        from controlplane import agents
        from network import protocol, quotas, services

        agents.register_report(protocol.NETWORK_APPLIED_REPORT, services.host_network_reported)
        quotas.register()
