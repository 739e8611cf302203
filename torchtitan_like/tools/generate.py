"""Sample text from a checkpoint: a DCP step folder (any layout it was saved under) or a
HuggingFace folder, on CPU or GPU, optionally tensor-parallel under torchrun.

    python scripts/generate.py outputs/debug_model/checkpoint/step-100 --prompt "The "
    python scripts/generate.py hf_out --prompt "The " --temperature 0.8 --top_k 50 --top_p 0.9
    torchrun --nproc_per_node 2 scripts/generate.py step-100 --tp 2 --prompt "The "

The prompt is ``[BOS] + encode(prompt)``, as every training document starts; generation stops
at EOS or after ``--max_new_tokens`` (and at the model's context length). Greedy decoding
(temperature 0, the default) equals ``transformers``' ``generate`` on the exported model
(tests/e2e/test_hf_export.py). There is no KV cache: every token runs the whole prefix, which
is simple and exact, and slow for long outputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from torchtitan_like.components.checkpoint import CheckpointError
from torchtitan_like.components.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_like.components.hf_checkpoint import (
    model_from_checkpoint,
    model_from_hf,
    model_of_folder,
    overrides_from_cli,
)
from torchtitan_like.config.manager import import_custom_modules
from torchtitan_like.distributed import lifecycle
from torchtitan_like.models.registry import get_model_spec


def load_model(path: Path, model_name: str | None = None, flavor: str | None = None,
               overrides: dict[str, str] | None = None) -> tuple[torch.nn.Module, int]:
    """(the full model in eval mode on CPU, its context length) from a DCP or HF folder; the
    model is the one the folder records (``model_name`` overrides), ``overrides`` the training
    job's [model] overrides (a DCP checkpoint records them)."""
    spec = model_of_folder(path, model_name)
    is_hf = (path / "config.json").is_file()
    model, args = (model_from_hf if is_hf else model_from_checkpoint)(spec, path, flavor,
                                                                      overrides)
    return model.eval(), args.max_seq_len


def next_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
               generator: torch.Generator) -> int:
    """One token from the last position's logits (vocab,): argmax at temperature 0, else a
    sample from softmax(logits / temperature) restricted to the top_k most likely tokens and
    to the smallest set whose probability reaches top_p (nucleus)."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        probs, order = torch.sort(logits.softmax(-1), descending=True)
        outside = probs.cumsum(-1) - probs >= top_p  # tokens after the nucleus is complete
        logits[order[outside]] = float("-inf")
    return int(torch.multinomial(logits.softmax(-1).cpu(), 1, generator=generator))


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: list[int], *, max_new_tokens: int, max_seq_len: int,
             eos_id: int | None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, pad_to: int = 1, device: torch.device | None = None) -> list[int]:
    """The generated token ids (without the prompt). ``pad_to``: the sequence is padded on the
    right to a multiple of it (tensor parallelism shards the sequence); causal attention keeps
    the padding out of every real position's logits."""
    device = device or torch.device("cpu")
    generator = torch.Generator().manual_seed(seed)
    tokens, out = list(prompt), []
    while len(out) < max_new_tokens and len(tokens) < max_seq_len:
        padded = tokens + [0] * (-len(tokens) % pad_to)
        logits = model(torch.tensor([padded], device=device))[0, len(tokens) - 1]
        token = next_token(logits, temperature, top_k, top_p, generator)
        tokens.append(token)
        out.append(token)
        if token == eos_id:
            break
    return out


def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return [tokenizer.bos_id, *tokenizer.encode(text)]


def tensor_parallel(model: torch.nn.Module, model_name: str, tp: int,
                    device: torch.device) -> torch.nn.Module:
    """The same weights split over ``tp`` ranks (this process group, launched by torchrun) with
    the model's own TP plan; the logits come back whole (no loss parallel)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims

    config = JobConfig()
    config.parallelism.tensor_parallel_degree = tp
    config.parallelism.disable_loss_parallel = True
    config.training.mixed_precision_param = "float32"
    parallel_dims = ParallelDims.from_config(config, torch.distributed.get_world_size())
    spec = get_model_spec(model_name)
    with torch.device("meta"):
        sharded = spec.model_cls(model.args)
    sharded = spec.parallelize_fn(sharded, parallel_dims,
                                  parallel_dims.build_meshes(device.type), config)
    sharded.to_empty(device=device)
    sharded.init_weights()  # the RoPE table; the weights come next
    set_model_state_dict(sharded, model.state_dict(),
                         options=StateDictOptions(full_state_dict=True))
    return sharded.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a DCP step-N folder or a HuggingFace one")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--tokenizer_path", default="",
                        help="the job's [model] tokenizer_path; default: the HF folder's "
                             "tokenizer.json, else byte-level")
    parser.add_argument("--max_new_tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top_k", type=int, default=0, help="0 = all tokens")
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="registered model name; default: the one the checkpoint.json (or "
                             "the HF config.json) records")
    parser.add_argument("--custom_import", action="append", default=[],
                        help="module registering the model (as [job] custom_import)")
    parser.add_argument("--flavor", default=None, help="override the detected flavor")
    parser.add_argument("--override", action="append", default=[], metavar="NAME=VALUE",
                        help="a [model] overrides entry of the training job, e.g. "
                        "moe.top_k=2 (repeatable)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (torchrun)")
    args = parser.parse_args(argv)
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        parser.error("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0")

    tokenizer_path = args.tokenizer_path or (
        str(args.checkpoint) if (args.checkpoint / "tokenizer.json").is_file() else "")
    try:
        tokenizer = build_tokenizer(tokenizer_path)
        import_custom_modules(args.custom_import)
        spec = model_of_folder(args.checkpoint, args.model)
        model, max_seq_len = load_model(args.checkpoint, spec.name, args.flavor,
                                        overrides_from_cli(args.override))
    except (ValueError, CheckpointError) as e:  # ConfigError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.tp > 1:
        from torchtitan_like.distributed.utils import init_distributed

        lifecycle.die_with_agent()
        device = init_distributed()  # this rank's device
        model = tensor_parallel(model, spec.name, args.tp, device)
    else:
        device = torch.device(args.device)
        model = model.to(device)
    out = generate(model, prompt_ids(tokenizer, args.prompt), max_new_tokens=args.max_new_tokens,
                   max_seq_len=max_seq_len, eos_id=tokenizer.eos_id,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   seed=args.seed, pad_to=args.tp, device=device)
    if args.tp == 1 or torch.distributed.get_rank() == 0:
        print(args.prompt + tokenizer.decode(out))
    if args.tp > 1:  # a torchrun worker: ends here, without gloo's exit race
        lifecycle.exit_process(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
