"""Broker connection options shared by the controller (Django settings) and the host agent.

Django-free on purpose: the agent imports it without a database or a secret key.
"""

from pathlib import Path

from kombu.transport import TRANSPORT_ALIASES

EMBEDDED_BROKER_URL = "filesystem://"
# Every process that talks to the embedded broker imports this module first (the settings,
# the agent's configuration): ``filesystem://`` means Kumo's atomic-write variant.
TRANSPORT_ALIASES["filesystem"] = "controlplane.fs_transport:Transport"
# ``redis://`` (and ``rediss://``) means kombu's Redis transport with the fix that keeps a
# worker alive when Redis restarts with a message in flight (``controlplane.redis_transport``).
TRANSPORT_ALIASES["redis"] = "controlplane.redis_transport:Transport"
TRANSPORT_ALIASES["rediss"] = "controlplane.redis_transport:Transport"


def transport_options(broker_url: str, var_dir: Path) -> dict:
    """Kombu transport options for ``broker_url``.

    For the embedded filesystem transport, every process of one machine must agree on the
    folders, so they derive from ``var_dir`` alone; the folders are created here. Other
    transports need nothing.
    """
    if not broker_url.startswith("filesystem://"):
        return {"visibility_timeout": 3600} if broker_url.startswith("redis") else {}
    base = Path(var_dir) / "broker"
    folders = {name: base / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
        "polling_interval": 0.1,
    }


# Names shared by both sides of the wire; the controller never imports agent code and the
# agent never imports controller code, so these strings are the contract.
CONTROL_QUEUE = "control"
AGENT_REPORT_TASK = "kumo.control.agent_report"
# A report of this kind carries others (``{"reports": [{"kind", "payload", "sent_at"}, ...]}``):
# an agent's periodic reports that fell due together, sent as one message.
BUNDLE_REPORT = "bundle"


def host_queue(host: str) -> str:
    """The queue a host's agent consumes: ``host.<name>``."""
    return f"host.{host}"
