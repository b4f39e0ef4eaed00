"""[host] Where ivralo's settings come from, and which value wins: the settings files, then a host's
command line, then what its caller gave (``resolve``, ``load``). The settings themselves, with their
help, defaults and bounds, are ``host/settings/model.py``'s; this module names them too, as
``from ivralo_kernel.host.settings.resolve import IvraloAgent`` always has.

Every host reads ``jupyter_ivralo_config.py`` / ``.json`` on Jupyter's config path, then
``--Section.trait=value`` on its command line, then values given in Python or in ``kernel.json``.
The workspace's own folder is never read: code in the kernel can write there.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from traitlets.config import Config

from ivralo_kernel.host.settings.config_files import CONFIG_FILE, config_files
from ivralo_kernel.host.settings.launch_settings import raw_launch_env
from ivralo_kernel.host.settings.model import (
    GIB,
    GRACE_MS,
    MIB,
    PROVISIONER_SECTION,
    Choice,
    Count,
    Flag,
    IvraloAgent,
    IvraloSettings,
    JupyterHostSettings,
    Seconds,
    every_setting,
    kernel_setting_names,
    plain_value,
)
from ivralo_kernel.protocol import ConfigError

# ---- where settings come from -------------------------------------------------------------------


@dataclass
class Layer:
    """One source of settings: a config file, the command line, kernel.json, or Python."""

    label: str
    config: Config = field(default_factory=Config)


def config_file_layers(paths: Sequence[str] | None = None) -> list[Layer]:
    """The person's settings files (``config_files``), the weakest first; a file that does not load
    is an error that says which file and why."""
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    layers = []
    for path in config_files(paths):
        folder, name = os.path.split(path)
        loader_class = PyFileConfigLoader if name.endswith(".py") else JSONFileConfigLoader
        try:
            config = loader_class(name, path=folder).load_config()
        except Exception as exc:  # noqa: BLE001 - any error in a person's config file: say which file
            raise ConfigError(
                path, f"this config file does not load ({type(exc).__name__}: {exc})", "Fix it or move it away"
            ) from None
        layers.append(Layer(path, config))
    return layers


def command_line_layer(argv: Iterable[str]) -> Layer:
    """``--IvraloSettings.deadline_ms=5000`` style arguments (anything else is refused)."""
    from traitlets.config.loader import KVArgParseConfigLoader

    args = list(argv)
    for arg in args:
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError(arg, "is not a setting", "Write settings as --IvraloSettings.NAME=VALUE")
    config = KVArgParseConfigLoader(argv=args).load_config() if args else Config()
    for section in config:
        if section not in SECTIONS:
            raise ConfigError(f"--{section}", "is not an ivralo settings section", f"Use one of: {', '.join(SECTIONS)}")
    return Layer("command line", config)


SECTIONS = ("IvraloSettings", PROVISIONER_SECTION, "IvraloAgent")


def section_of(values: Mapping[str, Any], section: str) -> Config:
    config = Config()
    config[section] = Config(dict(values))
    return config


@dataclass
class Effective:
    """Settings of one kind of host, and where each came from."""

    settings: IvraloSettings
    sources: dict[str, str]

    def rows(self) -> list[tuple[str, Any, str]]:
        return [(name, plain_value(getattr(self.settings, name)), self.sources[name]) for name in sorted(self.sources)]


def resolve(
    cls: type[IvraloSettings],
    layers: Sequence[Layer],
    given: Mapping[str, Any] | None = None,
    given_label: str = "given in Python",
) -> Effective:
    """Build ``cls`` from the layers (weakest first), then ``given``; check it; say where each value came from."""
    merged = Config()
    sections = cls.section_names()
    sources = {name: "default" for name in cls.class_trait_names(config=True)}
    for layer in layers:
        merged.merge(layer.config)
    # traitlets applies the merged sections widest first, so a narrower section beats a stronger layer.
    for section in sections:
        for layer in layers:
            if section in layer.config:
                for name in layer.config[section]:
                    if name not in every_setting():  # a typo would otherwise be ignored in silence
                        close = difflib.get_close_matches(name, sorted(every_setting()), n=1)
                        hint = f"Did you mean {close[0]}? " if close else ""
                        raise ConfigError(
                            f"{section}.{name} in {layer.label}",
                            "is not an ivralo setting",
                            f"{hint}`ivralo-kernel config` lists them",
                        )
                    if name in sources:
                        sources[name] = f"{layer.label} ({section})"
    for name in given or {}:
        if name not in sources:
            raise ConfigError(name, f"is not a setting of {cls.__name__}", f"Use one of: {', '.join(sorted(sources))}")
        sources[name] = given_label
    settings = cls(config=merged, **dict(given or {}))
    settings.check()
    return Effective(settings, sources)


def raw_launch_settings() -> dict[str, str]:
    """The ``IVRALO_*`` variables for what the person's settings files set (none without files)."""
    layers = config_file_layers()
    if not layers:
        return {}
    effective = resolve(JupyterHostSettings, layers)
    values = effective.settings.kernel_settings()
    return raw_launch_env({k: v for k, v in values.items() if effective.sources[k] != "default"})


def load(
    cls: type[IvraloSettings] = IvraloAgent, given: Mapping[str, Any] | None = None, argv: Iterable[str] = ()
) -> Effective:
    """What every host does: config files, then its command line, then what its caller gave."""
    return resolve(cls, [*config_file_layers(), command_line_layer(argv)], given)


__all__ = [  # with settings_model's names, which an import from here still finds
    "CONFIG_FILE",
    "GIB",
    "GRACE_MS",
    "MIB",
    "PROVISIONER_SECTION",
    "SECTIONS",
    "Choice",
    "Count",
    "Effective",
    "Flag",
    "IvraloAgent",
    "IvraloSettings",
    "JupyterHostSettings",
    "Layer",
    "Seconds",
    "command_line_layer",
    "config_file_layers",
    "every_setting",
    "kernel_setting_names",
    "load",
    "plain_value",
    "raw_launch_settings",
    "resolve",
    "section_of",
]
