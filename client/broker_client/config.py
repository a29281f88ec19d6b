"""Connection settings for the CLI: command-line flags, a named profile of a small INI file, the
environment, and the file's ``[default]`` section, in that order.

    # ~/.config/broker-client/config.ini (or $BROKER_CONFIG, or --config PATH)
    [default]
    url = http://127.0.0.1:8080

    [staging]
    url = https://broker.staging.example
    channel_token = ...
    producer_id = ...
    producer_token = ...
    consumer_token = ...
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass, fields
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"
ENVIRONMENT = {
    "url": "BROKER_URL",
    "channel_token": "BROKER_CHANNEL_TOKEN",
    "producer_id": "BROKER_PRODUCER_ID",
    "producer_token": "BROKER_PRODUCER_TOKEN",
    "consumer_token": "BROKER_CONSUMER_TOKEN",
    "admin_token": "BROKER_ADMIN_TOKEN",
    "hmac_secret": "BROKER_HMAC_SECRET",
}


class ConfigError(Exception):
    """A setting is missing, or the profile or config file cannot be used."""


@dataclass
class Settings:
    url: str = DEFAULT_URL
    channel_token: str | None = None
    producer_id: str | None = None
    producer_token: str | None = None
    consumer_token: str | None = None
    admin_token: str | None = None
    hmac_secret: str | None = None

    def need(self, *names: str) -> None:
        missing = [n for n in names if not getattr(self, n)]
        if missing:
            hints = ", ".join(f"--{n.replace('_', '-')} / {ENVIRONMENT[n]}" for n in missing)
            raise ConfigError(f"missing {hints} (or set them in a --profile)")


def config_path(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("BROKER_CONFIG"):
        return Path(os.environ["BROKER_CONFIG"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "broker-client" / "config.ini"


def _section(parser: configparser.ConfigParser, name: str) -> dict:
    known = {f.name for f in fields(Settings)}
    values = dict(parser[name]) if parser.has_section(name) else {}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown keys in [{name}]: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
    return values


def settings_load(*, flags: dict | None = None, profile: str | None = None, config: str | None = None,
                  environ=None) -> Settings:
    """The effective settings. ``flags`` (None values ignored) win, then ``profile`` (or
    ``$BROKER_PROFILE``) from the config file, then the environment, then the file's [default]."""
    environ = os.environ if environ is None else environ
    profile = profile or environ.get("BROKER_PROFILE") or None
    path = config_path(config or environ.get("BROKER_CONFIG"))
    parser = configparser.ConfigParser(default_section="__none__", interpolation=None)
    if path.exists():
        try:
            parser.read(path, encoding="utf-8")
        except configparser.Error as exc:
            raise ConfigError(f"{path}: {exc}") from None
    elif profile or config:
        raise ConfigError(f"config file {path} does not exist")
    if profile and not parser.has_section(profile):
        raise ConfigError(f"profile [{profile}] not found in {path}")
    values: dict = {}
    values.update(_section(parser, "default"))
    values.update({name: environ[var] for name, var in ENVIRONMENT.items() if environ.get(var)})
    if profile:
        values.update(_section(parser, profile))
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    return Settings(**values)
