"""Config sections registered by a fork: ``[my_section]`` beside the built-in ones.

A ``[job] custom_import`` module calls ``register_config_section("my_section", MySection)``
with a dataclass whose fields each have a type, a default and a docstring, like the built-in
sections (config/job_config.py). The section is then parsed from the TOML, overridable as
``--my_section.key=value``, listed by ``--help`` and ``--print_config``, and read as
``config.my_section``. If the dataclass has a ``validate(self)`` method, it runs at start-up
with the built-in checks and raises ``ConfigError`` for a config that cannot run.
(The modules named by ``custom_import`` are imported before the sections are parsed.)
"""

from __future__ import annotations

import dataclasses

from torchtitan_like.config.job_config import JobConfig

_SECTIONS: dict[str, type] = {}


def register_config_section(name: str, section_cls: type) -> None:
    """Add ``[name]``, holding a ``section_cls()`` unless the config sets its fields."""
    builtin = {f.name for f in dataclasses.fields(JobConfig)}
    if name in builtin or not dataclasses.is_dataclass(section_cls):
        raise ValueError(f"config section [{name}]: must be a dataclass and not shadow a "
                         "built-in section")
    if _SECTIONS.get(name, section_cls) is not section_cls:
        raise ValueError(f"a config section [{name}] is already registered")
    _SECTIONS[name] = section_cls


def custom_sections() -> dict[str, type]:
    """Registered section name -> dataclass, in registration order."""
    return dict(_SECTIONS)


def new_job_config() -> JobConfig:
    """A JobConfig of defaults, with a default instance of every registered section."""
    config = JobConfig()
    for name, section_cls in _SECTIONS.items():
        setattr(config, name, section_cls())
    return config


def validate_custom_sections(config: JobConfig) -> None:
    for name in _SECTIONS:
        section = getattr(config, name)
        if hasattr(section, "validate"):
            section.validate()
