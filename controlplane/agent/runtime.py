"""The running agent's state: its configuration, fixed at start."""

import time

from controlplane.agent.config import AgentConfig

STARTED = time.monotonic()
_config: AgentConfig | None = None


def configure(config: AgentConfig) -> None:
    global _config
    _config = config


def config() -> AgentConfig:
    if _config is None:
        configure(AgentConfig.from_env())
    return _config
