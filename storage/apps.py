from django.apps import AppConfig


class StorageConfig(AppConfig):
    name = "storage"
    verbose_name = "Storage"

    def ready(self):
        from controlplane import agents
        from storage import protocol, quotas, services

        agents.register_report(protocol.SHARE_APPLIED_REPORT, services.share_reported)
        quotas.register()
        _follow_vm_addresses()


def _follow_vm_addresses():
    """A share is exported to exactly its project's VMs' addresses: when a port or one of
    its addresses is saved or deleted, the project's shares are sent again after commit."""
    from django.db.models.signals import post_save, pre_delete

    from network.models import FixedIp, Port
    from storage import services

    def port_changed(sender, instance, **kwargs):
        if instance.vm_id is not None or kwargs.get("signal") is pre_delete:
            services.shares_follow_vms(instance.project_id)

    def address_changed(sender, instance, **kwargs):
        project_id = (
            Port.objects.filter(pk=instance.port_id).values_list("project_id", flat=True).first()
        )
        services.shares_follow_vms(project_id, instance.address)

    for signal in (post_save, pre_delete):
        signal.connect(
            port_changed, sender=Port, weak=False, dispatch_uid=f"kumo-share-port-{id(signal)}"
        )
        signal.connect(
            address_changed, sender=FixedIp, weak=False, dispatch_uid=f"kumo-share-ip-{id(signal)}"
        )
