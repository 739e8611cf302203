"""Activation memory of one training step under each activation-checkpointing mode, measured
with MemTracker beside Korthikanti et al.'s per-layer formula (components/memory.py).

    python scripts/activation_memory.py [--job.config_file train_configs/debug_model.toml]
                                        [--section.key=value ...]

One process, the config's model, micro-batch and sequence length, its parameter dtype, random
tokens (memory does not depend on their values). Rows: no checkpointing, op-level selective,
every 2nd block, every block; plus no checkpointing with SDPA's math backend, which keeps the
a*s*s attention scores the formula's 5as/h term counts (the default fused attention never
stores them). Prints a Markdown table.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchtitan_like.components.memory import korthikanti_activation_bytes, measure_step_memory
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.job_config import ActivationCheckpoint
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.models.registry import model_spec_and_args
from torchtitan_like.protocols.loss import cross_entropy_sum
from torchtitan_like.validate import parse_args

MiB = 2**20
DEFAULT_CONFIG = "train_configs/debug_model.toml"

# name, [activation_checkpoint] mode and option, formula row (mode, every), math attention
ROWS = [
    ("none", "none", "", ("none", 1), False),
    ("selective op", "selective", "op", ("selective", 1), False),
    ("selective every 2", "selective", "2", ("full", 2), False),
    ("full", "full", "", ("full", 1), False),
    ("none, math attention", "none", "", ("none", 1), True),
]


def main(argv: list[str]) -> None:
    if not any(a.startswith("--job.config_file") for a in argv):
        argv = ["--job.config_file", DEFAULT_CONFIG, *argv]
    config = parse_args(argv, world_size=1)
    spec, args = model_spec_and_args(config)
    t = config.training
    dtype = DTYPES[t.dtype]
    torch.manual_seed(config.debug.seed)
    tokens = torch.randint(0, args.vocab_size, (t.local_batch_size, t.seq_len + 1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    sbh = t.seq_len * t.local_batch_size * args.dim
    element = torch.finfo(dtype).bits // 8
    print(f"{config.model.name} {config.model.flavor}: s={t.seq_len} b={t.local_batch_size} "
          f"h={args.dim} a={args.n_heads} L={args.n_layers}, {t.dtype} activations "
          f"(sbh = {sbh * element / MiB:.2f} MiB); MiB per layer unless marked\n")
    print("| mode | measured / layer | measured bytes / sbh | formula / layer (16-bit) | "
          f"formula x {element}/2 ({t.dtype}) | peak act.+temp (step) | peak total (step) |")
    print("|---|---|---|---|---|---|---|")
    for name, mode, option, (formula_mode, every), math_attention in ROWS:
        model = spec.model_cls(args).to(dtype)
        model.init_weights()
        apply_ac(model.layers, ActivationCheckpoint(mode=mode, selective_ac_option=option))

        def attention(math_attention=math_attention) -> contextlib.AbstractContextManager:
            return sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext()

        def forward(model=model, attention=attention) -> torch.Tensor:
            with attention():
                return cross_entropy_sum(model(inputs), labels) / labels.numel()

        with attention():  # recomputation in backward must use the same attention kernel
            memory = measure_step_memory(model, forward, device=torch.device("cpu"),
                                         blocks=list(model.layers.values()))
        per_layer = sum(memory.per_block) / len(memory.per_block)
        formula = korthikanti_activation_bytes(
            formula_mode, seq_len=t.seq_len, batch=t.local_batch_size, dim=args.dim,
            n_heads=args.n_heads, every=every)
        print(f"| {name} | {per_layer / MiB:.2f} | {per_layer / sbh:.1f} | "
              f"{formula / MiB:.2f} | {formula * element / 2 / MiB:.2f} | "
              f"{memory.peak_activations / MiB:.1f} | {memory.peak_total / MiB:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])

