from django.apps import AppConfig


class ComputeConfig(AppConfig):
    name = "compute"
    verbose_name = "Compute"

    def ready(self):
        from compute import protocol, quotas, services
        from controlplane import agents

        agents.register_report("heartbeat", services.host_heartbeat_reported)
        agents.register_report(protocol.INVENTORY_REPORT, services.inventory_reported)
        agents.register_report(protocol.GUESTS_REPORT, services.guests_reported)
        agents.register_report(protocol.VM_OBSERVED_REPORT, services.vm_observed)
        quotas.register()
