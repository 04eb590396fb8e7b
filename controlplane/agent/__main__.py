"""``python -m controlplane.agent --host gpu-01 [--libvirt-uri URI]``: run one host's agent."""

import argparse

from controlplane.agent.app import create_app
from controlplane.agent.config import AgentConfig
from controlplane.broker import host_queue


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="kumo-agent", description=__doc__)
    parser.add_argument("--host", help="host name (default: $KUMO_AGENT_HOST or the hostname)")
    parser.add_argument("--libvirt-uri", help="default: $KUMO_LIBVIRT_URI or qemu:///system")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    config = AgentConfig.from_env(host=args.host, libvirt_uri=args.libvirt_uri)
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
