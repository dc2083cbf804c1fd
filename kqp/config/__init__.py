"""kqp.config: YAML files validated into frozen typed models, written back and watched."""

from kqp.config.errors import ConfigError, ConfigProblem
from kqp.config.loader import load_config
from kqp.config.models import KqpConfig
from kqp.config.watch import ConfigFiles
from kqp.config.writeback import find_quota_file, write_quota_entries

__all__ = [
    "ConfigError",
    "ConfigFiles",
    "ConfigProblem",
    "KqpConfig",
    "find_quota_file",
    "load_config",
    "write_quota_entries",
]
