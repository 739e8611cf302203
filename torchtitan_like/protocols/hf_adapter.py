"""``HFAdapter``: how a model shape maps to and from HuggingFace names and config."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class HFAdapter(Protocol):
    """Maps one model shape to and from HuggingFace (models/llama3/hf_adapter.py is one)."""

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Our parameter FQNs -> HF names; the values are passed through."""

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """HF names -> our FQNs."""

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        """The config.json describing this shape, weights stored in ``dtype``."""

    def check_config(self, hf_config: dict[str, Any]) -> None:
        """Raise ValueError naming what differs if ``hf_config`` is not this shape."""
