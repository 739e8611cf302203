"""The one error type of a config that cannot run, at the bottom of the import graph so that
every layer (config parsing, models, distributed, components) can raise it (``require``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config that cannot run; the message says what to change."""


def require(condition: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def did_you_mean(name: str, options: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else ""


def unknown_registered(field: str, kind: str, name: str, registered: list[str],
                       how: str = "") -> ConfigError:
    """The one line for a name no registry holds (a converter, an optimizer): what is
    registered, the nearest name, and that one of your own comes from ``[job] custom_import``."""
    article = "an" if kind[0] in "aeiou" else "a"
    return ConfigError(
        f"{field}: unknown {kind} {name!r}; registered: {', '.join(registered)}"
        + did_you_mean(name, registered) + f" ({article} {kind} of your own is registered by a "
        f"module named in [job] custom_import{how})")
