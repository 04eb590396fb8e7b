"""``python -m controlplane.agent --host gpu-01 [--libvirt-uri URI] [--network-… …]``: run
one host's agent. Options override the environment (``controlplane.agent.config``)."""

import argparse

from controlplane.agent.app import create_app
from controlplane.agent.config import AgentConfig
from controlplane.broker import host_queue


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="kumo-agent", description=__doc__)
    parser.add_argument("--host", help="host name (default: $KUMO_AGENT_HOST or the hostname)")
    parser.add_argument("--libvirt-uri", help="default: $KUMO_LIBVIRT_URI or qemu:///system")
    parser.add_argument("--network-vtep", help="underlay address (default: $KUMO_NETWORK_VTEP)")
    parser.add_argument("--network-netns", help="namespace to converge ($KUMO_NETWORK_NETNS)")
    parser.add_argument("--network-underlay-device", help="($KUMO_NETWORK_UNDERLAY_DEVICE)")
    parser.add_argument(
        "--network-gateway", action="store_true", default=None, help="run project routers"
    )
    parser.add_argument("--network-external-bridge", help="($KUMO_NETWORK_EXTERNAL_BRIDGE)")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    config = AgentConfig.from_env(
        host=args.host,
        libvirt_uri=args.libvirt_uri,
        network_vtep=args.network_vtep,
        network_netns=args.network_netns,
        network_underlay_device=args.network_underlay_device,
        network_gateway=args.network_gateway,
        network_external_bridge=args.network_external_bridge,
    )
    app = create_app(config)
    app.worker_main(
        [
            "worker",
            "--queues",
            host_queue(config.host),
            "--hostname",
            f"agent@{config.host}",
            "--pool",
            "threads",
            "--concurrency",
            str(config.concurrency),
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            args.loglevel,
        ]
    )


if __name__ == "__main__":
    main()
