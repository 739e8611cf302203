"""A config section registered from outside the package: [research]."""

from dataclasses import dataclass
from typing import Literal

from torchtitan_like.config.custom_sections import register_config_section
from torchtitan_like.config.errors import ConfigError


@dataclass
class Research:
    z_coef: float = 1e-4
    """Weight of the z-loss term."""

    router: Literal["softmax", "sigmoid"] = "softmax"
    """How the router scores experts."""

    def validate(self) -> None:
        if self.z_coef < 0:
            raise ConfigError(f"[research] z_coef = {self.z_coef}: must be >= 0")


register_config_section("research", Research)
