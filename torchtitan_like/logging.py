"""The package logger. torchrun prefixes each line with the rank that wrote it."""

from __future__ import annotations

import logging

logger = logging.getLogger("torchtitan_like")


def init_logger() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
