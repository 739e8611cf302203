"""Tokenizers: byte-level (needs no file) and HuggingFace ``tokenizer.json`` files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from torchtitan_like.config.errors import ConfigError


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; BOS = 256, EOS = 257. Lossless for any text."""

    vocab_size = 258
    bos_id = 256
    eos_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]")


class HuggingFaceTokenizer:
    """A ``tokenizer.json`` read by the ``tokenizers`` package (extra ``hf``). BOS/EOS come
    from a ``tokenizer_config.json`` beside it, else from the usual special-token names."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _HFTokenizer

        self._tok = _HFTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        config_file = path.parent / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self.bos_id = self._special_id(config.get("bos_token"), _BOS_NAMES, "BOS", path)
        self.eos_id = self._special_id(config.get("eos_token"), _EOS_NAMES, "EOS", path)

    def _special_id(self, configured, names: tuple[str, ...], what: str, path: Path) -> int:
        if isinstance(configured, dict):
            configured = configured.get("content")
        for name in ([configured] if configured else []) + list(names):
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return token_id
        raise ConfigError(f"tokenizer {path}: no {what} token found (tried {', '.join(names)})")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def build_tokenizer(tokenizer_path: str) -> Tokenizer:
    if not tokenizer_path:
        return ByteTokenizer()
    path = Path(tokenizer_path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"[model] tokenizer_path: {path} does not exist")
    try:
        return HuggingFaceTokenizer(path)
    except ImportError as e:
        raise ConfigError(
            "[model] tokenizer_path needs the `tokenizers` package: pip install -e '.[hf]'"
        ) from e
    except ConfigError:
        raise
    except Exception as e:  # tokenizers raises a bare Exception for a corrupt file
        raise ConfigError(f"[model] tokenizer_path: {path} is not a readable tokenizer.json "
                          f"({' '.join(str(e).split())})") from e
