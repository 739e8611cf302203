from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import ConfigError, parse_args

__all__ = ["ConfigError", "JobConfig", "parse_args"]
