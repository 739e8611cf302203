"""The one error type of a config that cannot run, at the bottom of the import graph so that
every layer (config parsing, models, distributed, components) can raise it (``require``)."""


class ConfigError(ValueError):
    """A config that cannot run; the message says what to change."""


def require(condition: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)
