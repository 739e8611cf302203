"""The package logger. torchrun prefixes each line with the rank that wrote it."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("torchtitan_like")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the stream of the
    moment the logger was set up (which a caller, e.g. a test's capture, may have closed)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def init_logger() -> None:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
