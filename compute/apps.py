from django.apps import AppConfig


class ComputeConfig(AppConfig):
    name = "compute"
    verbose_name = "Compute"

    def ready(self):
        from compute import services
        from controlplane import agents

        agents.register_report("heartbeat", services.host_heartbeat)
