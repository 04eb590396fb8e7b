"""The agent's own configuration, from the environment. No database, no secret key."""

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from controlplane.broker import EMBEDDED_BROKER_URL, transport_options

BASE_DIR = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class AgentConfig:
    host: str  # KUMO_AGENT_HOST: the host's name in Kumo; its queue is host.<host>
    broker_url: str  # CELERY_BROKER_URL: the controller's broker (default: embedded)
    var_dir: Path  # KUMO_VAR_DIR: shared with the controller for the embedded broker
    libvirt_uri: str  # KUMO_LIBVIRT_URI: qemu:///system, or test:///path/node.xml
    heartbeat_s: float  # KUMO_HEARTBEAT_INTERVAL_S: seconds between heartbeats
    concurrency: int  # KUMO_AGENT_CONCURRENCY: host tasks run at once
    instances_dir: Path  # KUMO_INSTANCES_DIR: per-guest files (seed ISO, root overlay)
    guests_report_s: float  # KUMO_GUESTS_REPORT_INTERVAL_S: seconds between guests reports
    inventory_report_s: float  # KUMO_INVENTORY_INTERVAL_S: seconds between inventory reports
    # KUMO_GUEST_CPU_MODE: libvirt's <cpu mode> for guests, host-passthrough (default) or
    # host-model. KUMO_GUEST_CPU_DISABLE: comma-separated CPU features hidden from guests, for
    # a host that is itself a VM (nested KVM may refuse e.g. arch-capabilities).
    guest_cpu_mode: str = "host-passthrough"
    guest_cpu_disable: tuple[str, ...] = ()
    # KUMO_GUEST_ACCEL: auto (default), kvm or tcg: how guests on qemu:///system run, KVM or
    # QEMU's emulation; auto picks TCG where KVM cannot boot a stock kernel
    # (compute.drivers.accel). The resolved choice is reported with the inventory.
    guest_accel: str = "auto"
    # The network side. KUMO_NETWORK_VTEP: this host's underlay address, the VXLAN tunnel
    # end point; empty, the agent does no tenant networking and says so. KUMO_NETWORK_NETNS:
    # the network namespace it converges (empty: the host's own; simulated hosts get one
    # each). KUMO_NETWORK_UNDERLAY_DEVICE / _MTU: the underlay link and its MTU.
    # KUMO_NETWORK_GATEWAY=1: this host runs the project routers and their NAT, with
    # KUMO_NETWORK_EXTERNAL_BRIDGE (an existing bridge onto the external network) and
    # KUMO_NETWORK_TRUNK_DEVICE (an existing link carrying L2VPN VLANs).
    # KUMO_NETWORK_REPORT_INTERVAL_S: seconds between network reports (each one resyncs).
    network_vtep: str = ""
    network_netns: str = ""
    network_underlay_device: str = ""
    network_underlay_mtu: int = 1500
    network_gateway: bool = False
    network_external_bridge: str = ""
    network_trunk_device: str = ""
    network_report_s: float = 30.0
    # KUMO_AGENT_APPLIED_DIR: the agent's record of the last generation applied to each guest,
    # removals included (``compute.drivers.applied``); default: beside the instances folder.
    applied_dir: Path | None = None
    # KUMO_IMAGE_CACHE_DIR: where this host keeps the images its guests' root disks are
    # overlays on, one file per checksum (default: <var>/image-cache/<host>). Fetched on
    # first use, verified before every use (compute.drivers.imagecache).
    image_cache_dir: Path | None = None
    # KUMO_IMAGE_CACHE_PRUNE_INTERVAL_S: seconds between prunes of that cache (one at start);
    # KUMO_IMAGE_CACHE_MIN_AGE_S: a copy no disk here is based on goes once unused this long;
    # KUMO_IMAGE_CACHE_MAX_GIB: over this size, such copies go sooner, least recently used
    # first (0: no cap).
    image_cache_prune_s: float = 3600.0
    image_cache_min_age_s: float = 86400.0
    image_cache_max_gib: float = 0.0
    # KUMO_SHELVE_STORE: where shelved VMs' disks are kept (the controller's setting, the same
    # path on every host); the prune keeps the images that disks there are based on.
    shelve_store: Path = Path("/var/lib/kumo/shelved")

    @property
    def transport_options(self) -> dict:
        return transport_options(self.broker_url, self.var_dir)

    @classmethod
    def from_env(cls, **overrides) -> "AgentConfig":
        env = os.environ
        values = {
            "host": env.get("KUMO_AGENT_HOST") or socket.gethostname().split(".")[0],
            "broker_url": env.get("CELERY_BROKER_URL") or EMBEDDED_BROKER_URL,
            "var_dir": Path(env.get("KUMO_VAR_DIR", BASE_DIR / "var")).resolve(),
            "libvirt_uri": env.get("KUMO_LIBVIRT_URI", "qemu:///system"),
            "heartbeat_s": float(env.get("KUMO_HEARTBEAT_INTERVAL_S", "10")),
            "concurrency": int(env.get("KUMO_AGENT_CONCURRENCY", "4")),
            "guests_report_s": float(env.get("KUMO_GUESTS_REPORT_INTERVAL_S", "30")),
            "inventory_report_s": float(env.get("KUMO_INVENTORY_INTERVAL_S", "600")),
            "guest_cpu_mode": env.get("KUMO_GUEST_CPU_MODE", "host-passthrough"),
            "guest_cpu_disable": tuple(
                f.strip() for f in env.get("KUMO_GUEST_CPU_DISABLE", "").split(",") if f.strip()
            ),
            "guest_accel": env.get("KUMO_GUEST_ACCEL", "auto"),
            "network_vtep": env.get("KUMO_NETWORK_VTEP", ""),
            "network_netns": env.get("KUMO_NETWORK_NETNS", ""),
            "network_underlay_device": env.get("KUMO_NETWORK_UNDERLAY_DEVICE", ""),
            "network_underlay_mtu": int(env.get("KUMO_NETWORK_UNDERLAY_MTU", "1500")),
            "network_gateway": env.get("KUMO_NETWORK_GATEWAY", "") in ("1", "true", "yes"),
            "network_external_bridge": env.get("KUMO_NETWORK_EXTERNAL_BRIDGE", ""),
            "network_trunk_device": env.get("KUMO_NETWORK_TRUNK_DEVICE", ""),
            "network_report_s": float(env.get("KUMO_NETWORK_REPORT_INTERVAL_S", "30")),
            "image_cache_prune_s": float(env.get("KUMO_IMAGE_CACHE_PRUNE_INTERVAL_S", "3600")),
            "image_cache_min_age_s": float(env.get("KUMO_IMAGE_CACHE_MIN_AGE_S", "86400")),
            "image_cache_max_gib": float(env.get("KUMO_IMAGE_CACHE_MAX_GIB", "0")),
            "shelve_store": Path(env.get("KUMO_SHELVE_STORE", "/var/lib/kumo/shelved")),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        values.setdefault(
            "instances_dir",
            Path(env.get("KUMO_INSTANCES_DIR") or values["var_dir"] / "instances" / values["host"]),
        )
        if env.get("KUMO_AGENT_APPLIED_DIR"):
            values.setdefault("applied_dir", Path(env["KUMO_AGENT_APPLIED_DIR"]))
        if values.get("applied_dir") is None:
            instances = Path(values["instances_dir"])
            values["applied_dir"] = instances.with_name(instances.name + ".applied")
        values.setdefault(
            "image_cache_dir",
            Path(
                env.get("KUMO_IMAGE_CACHE_DIR")
                or values["var_dir"] / "image-cache" / values["host"]
            ),
        )
        return cls(**values)
