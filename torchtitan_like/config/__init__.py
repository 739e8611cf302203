from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig

__all__ = ["ConfigError", "JobConfig"]
