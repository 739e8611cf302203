"""HuggingFace folders that work as HF models: weights and config.json (hf_checkpoint.py),
plus the job's tokenizer files, ``generation_config.json`` and the BOS/EOS ids, so that
``transformers.pipeline("text-generation", model=folder)`` runs as it is.

The byte-level tokenizer has no file of its own; it is written as a ``tokenizer.json`` that
encodes identically: GPT-2's byte-to-character table, a BPE model whose 256 tokens are the 256
bytes (id = byte value) and no merges, then BOS = 256 and EOS = 257 as special tokens. A
post-processor prepends BOS, as the training stream starts every document with it, so an HF
tokenizer call gives ``[BOS] + encode(text)``: the prompt the platform's generation uses.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import torch

from torchtitan_like.components.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_like.components.hf_checkpoint import model_from_checkpoint, save_hf
from torchtitan_like.components.storage import writing
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger
from torchtitan_like.models.registry import get_model_spec
from torchtitan_like.protocols.model_spec import ModelSpec

BYTE_BOS, BYTE_EOS = "<|begin_of_text|>", "<|end_of_text|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (what ByteLevel decoding undoes):
    printable Latin-1 bytes map to themselves, the others to 256, 257, ... in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    table, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def byte_tokenizer_json(path: Path) -> None:
    """Write the byte-level tokenizer (ids 0-255 = bytes, BOS 256, EOS 257) as tokenizer.json."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BYTE_BOS, special=True),
                                  AddedToken(BYTE_EOS, special=True)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BYTE_BOS} $A", pair=f"{BYTE_BOS} $A {BYTE_BOS} $B",
        special_tokens=[(BYTE_BOS, 256)])
    tokenizer.save(str(path))


def write_tokenizer_files(tokenizer_path: str, tokenizer: Tokenizer, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json of the job's tokenizer into ``folder``."""
    if tokenizer_path:
        source = Path(tokenizer_path)
        source = source / "tokenizer.json" if source.is_dir() else source
        shutil.copyfile(source, folder / "tokenizer.json")
        config_file = source.parent / "tokenizer_config.json"
        if config_file.is_file():
            shutil.copyfile(config_file, folder / "tokenizer_config.json")
            return
        from tokenizers import Tokenizer as HFTokenizer

        names = HFTokenizer.from_file(str(source))
        bos, eos = names.id_to_token(tokenizer.bos_id), names.id_to_token(tokenizer.eos_id)
    else:
        byte_tokenizer_json(folder / "tokenizer.json")
        bos, eos = BYTE_BOS, BYTE_EOS
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def add_generation_files(folder: Path, tokenizer_path: str) -> None:
    """Tokenizer files, generation_config.json and the BOS/EOS ids in config.json."""
    tokenizer = build_tokenizer(tokenizer_path)
    write_tokenizer_files(tokenizer_path, tokenizer, folder)
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **ids}, indent=1))
    generation = {**ids, "pad_token_id": tokenizer.eos_id, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))


def export_checkpoint(spec: ModelSpec, checkpoint: Path, folder: Path, tokenizer_path: str,
                      dtype: torch.dtype) -> Path:
    """A DCP step folder (any layout) -> a HuggingFace folder that transformers runs as is."""
    model, args = model_from_checkpoint(spec, checkpoint)
    save_hf(model.state_dict(), spec.hf_adapter(args), folder, dtype)
    add_generation_files(folder, tokenizer_path)
    return folder


def validate_hf_export(config: JobConfig) -> None:
    """``[checkpoint] last_save_in_hf`` needs an HF adapter and the tokenizers package (without
    ``[checkpoint] enable`` there is no last save: a setting without effect)."""
    if not exports_last_save(config):
        return
    if get_model_spec(config.model.name).hf_adapter is None:
        raise ConfigError(f"[checkpoint] last_save_in_hf: model {config.model.name!r} has no "
                          "HuggingFace adapter (ModelSpec.hf_adapter)")
    if importlib.util.find_spec("tokenizers") is None:
        raise ConfigError("[checkpoint] last_save_in_hf writes tokenizer files with the "
                          "`tokenizers` package: pip install -e '.[hf]'")


def exports_last_save(config: JobConfig) -> bool:
    """The job writes its last save as a HuggingFace folder too: last_save_in_hf, with a last
    save to convert (``[checkpoint] enable``)."""
    return config.checkpoint.enable and config.checkpoint.last_save_in_hf


def export_last_save(config: JobConfig, checkpoint_folder: Path, step: int) -> Path:
    """``[checkpoint] last_save_in_hf``: the complete last save step-N as step-N-hf (one
    process reads the DCP files, whatever layout wrote them, checking their checksums; the
    safetensors carry their own)."""
    folder = checkpoint_folder / f"step-{step}-hf"
    with writing("the HuggingFace export", folder):  # a full disk: one line, exit 4
        export_checkpoint(get_model_spec(config.model.name), checkpoint_folder / f"step-{step}",
                          folder, config.model.tokenizer_path,
                          DTYPES[config.checkpoint.export_dtype])
    logger.info(f"checkpoint step {step}: HuggingFace folder written to {folder}")
    return folder
