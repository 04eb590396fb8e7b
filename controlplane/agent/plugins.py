"""What each app contributes to the agent: its host task module and its part of the heartbeat.

An app lists itself here with a Django-free module; compute and network add their drivers'
inventory and observed state the same way.
"""

# Modules holding host tasks (Celery tasks that run on the agent).
HOST_TASK_MODULES = [
    "controlplane.agent.tasks",
    "compute.host_tasks",
    "network.host_tasks",
    "storage.host_tasks",
]

# Periodic reports: (function path, the AgentConfig field with its interval in seconds).
# Each is sent once when the agent starts, then every interval; a failed one is logged and
# the next one tries again.
REPORTERS = [
    ("compute.host_tasks:inventory_report", "inventory_report_s"),
    ("compute.host_tasks:guests_report", "guests_report_s"),
    ("network.host_tasks:network_report", "network_report_s"),
    ("compute.host_tasks:image_cache_prune", "image_cache_prune_s"),
]


def heartbeat_payload(config, started_at: str) -> dict:
    """The heartbeat: who the agent is and what it can do."""
    from controlplane.agent import VERSION

    return {
        "version": VERSION,
        "started_at": started_at,
        "libvirt_uri": config.libvirt_uri,
        "capabilities": sorted(m.split(".")[0] for m in HOST_TASK_MODULES),
    }
