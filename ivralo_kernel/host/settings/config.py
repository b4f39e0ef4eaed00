"""[host] ``WorkerConfig``: the agent-facing façade over the one settings model (``IvraloAgent``).

``WorkerConfig(deadline_ms=15_000)`` is what the agent API has always taken. Behind it, the values a
caller gives override what Jupyter's config path says (``jupyter_ivralo_config``), which overrides the
model's defaults; the result is checked at construction, so an invalid combination raises
``ConfigError`` naming the field and the fix, not at the first call that would have misbehaved.
"""

from __future__ import annotations

from typing import Any

from ivralo_kernel.host.settings.resolve import IvraloAgent, load


class WorkerConfig:
    """Read-only: build a new one to change a setting. Every ``IvraloAgent`` trait is an attribute."""

    __slots__ = ("_argv", "_effective", "_given")

    def __init__(self, **given: Any) -> None:
        self._build(given, ())

    def _build(self, given: dict[str, Any], argv: tuple[str, ...]) -> None:
        object.__setattr__(self, "_given", dict(given))
        object.__setattr__(self, "_argv", argv)
        object.__setattr__(self, "_effective", load(IvraloAgent, given, argv))

    @classmethod
    def from_command_line(cls, argv: tuple[str, ...], **given: Any) -> WorkerConfig:
        """With ``--IvraloAgent.max_workers=4`` style arguments between the config files and ``given``."""
        config = cls.__new__(cls)
        config._build(given, tuple(argv))
        return config

    def replace(self, **changes: Any) -> WorkerConfig:
        """A copy with some values given anew (like ``dataclasses.replace``)."""
        return WorkerConfig.from_command_line(self._argv, **{**self._given, **changes})

    @property
    def settings(self) -> IvraloAgent:
        """The full settings object these values make (the defaults, the settings files, then these)."""
        settings = self._effective.settings
        assert isinstance(settings, IvraloAgent)
        return settings

    @property
    def sources(self) -> dict[str, str]:
        """Where each value came from: "default", a config file, "command line", "given in Python"."""
        return dict(self._effective.sources)

    def __getattr__(self, name: str) -> Any:
        if name in self._effective.sources:
            return getattr(self._effective.settings, name)
        raise AttributeError(f"WorkerConfig has no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"WorkerConfig is read-only: build a new one, WorkerConfig({name}=...)")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerConfig):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self.as_dict().items())))

    def as_dict(self) -> dict[str, Any]:
        """Every setting's effective value, by name."""
        return {name: value for name, value, _ in self._effective.rows()}

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in sorted(self._given.items()))
        return f"WorkerConfig({given})"
