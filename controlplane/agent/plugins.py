"""What each app contributes to the agent: its host task module and its part of the heartbeat.

An app lists itself here with a Django-free module; compute and network add their drivers'
inventory and observed state the same way.
"""

# Modules holding host tasks (Celery tasks that run on the agent).
HOST_TASK_MODULES = [
    "controlplane.agent.tasks",
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
