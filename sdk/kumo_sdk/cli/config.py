"""The CLI's configuration: which server, which token, which project.

One JSON file, ``$KUMO_CONFIG`` or else ``~/.config/kumo/config.json``
(``$XDG_CONFIG_HOME/kumo/config.json`` when that is set). It holds an API token, so it is
written readable by its owner only, and replaced whole (write, then rename): a crash never
leaves half a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


def config_path() -> Path:
    if os.environ.get("KUMO_CONFIG"):
        return Path(os.environ["KUMO_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "kumo" / "config.json"


class ConfigError(Exception):
    """The configuration file exists but cannot be read."""


@dataclass
class Config:
    url: str = ""
    token: str = ""
    token_id: int | None = None
    username: str = ""
    project: str | None = None

    @classmethod
    def load(cls) -> Config:
        """The saved configuration; an empty one when there is no file yet."""
        path = config_path()
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}; `kumo login` writes a new one") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} holds no JSON object; `kumo login` writes a new one")
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def save(self) -> Path:
        path = config_path()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # also when an old temporary file was left with other modes
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
        return path
