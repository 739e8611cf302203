"""Convert between our DCP checkpoints and HuggingFace safetensors folders (one process).

    # a checkpoint (saved under any layout) -> a HuggingFace folder loadable by transformers
    python scripts/convert_hf.py to_hf outputs/debug_model/checkpoint/step-100 hf_out \\
        --dtype bfloat16

    # HuggingFace weights -> the seed checkpoint (step-0) of a dump folder's checkpoint folder;
    # a job with [checkpoint] enable = true and that dump folder then starts from them
    python scripts/convert_hf.py from_hf path/to/Llama-3.2-1B outputs/ft/checkpoint

The model and flavor come from the checkpoint's checkpoint.json (to_hf), or from config.json
(from_hf: the registered model whose HF adapter writes its ``model_type``, and the flavor whose
shape it describes); ``--model`` and ``--flavor`` override. A job trained with ``[model] overrides``
records them in checkpoint.json (to_hf); for from_hf give them as ``--override moe.top_k=2``
(repeatable), so that the flavor is matched with the job's shape. To load HF weights straight into a
sharded job instead, set ``[checkpoint] initial_load_path`` and ``initial_load_in_hf = true``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchtitan_like.components.checkpoint import CheckpointError
from torchtitan_like.components.hf_checkpoint import (
    hf_to_seed_checkpoint,
    model_from_checkpoint,
    model_of_folder,
    overrides_from_cli,
    save_hf,
)
from torchtitan_like.components.hf_export import add_generation_files
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.manager import ConfigError, import_custom_modules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    to_hf = sub.add_parser("to_hf", help="DCP checkpoint step folder -> HuggingFace folder")
    to_hf.add_argument("checkpoint", type=Path, help="a step-N folder")
    to_hf.add_argument("output", type=Path, help="HuggingFace folder to write")
    to_hf.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    to_hf.add_argument("--max_shard_gb", type=float, default=5.0)
    to_hf.add_argument("--tokenizer_path", default="",
                       help="the job's [model] tokenizer_path (default: byte-level)")
    from_hf = sub.add_parser("from_hf", help="HuggingFace folder -> seed checkpoint step-0")
    from_hf.add_argument("hf_folder", type=Path)
    from_hf.add_argument("checkpoint_folder", type=Path,
                         help="a checkpoint folder, e.g. <dump_folder>/checkpoint")
    for p in (to_hf, from_hf):
        p.add_argument("--model", default=None,
                       help="registered model name; default: the one the folder records")
        p.add_argument("--flavor", default=None, help="override the detected flavor")
        p.add_argument("--override", action="append", default=[], metavar="NAME=VALUE",
                       help="a [model] overrides entry, e.g. moe.num_experts=16 (repeatable; "
                       "to_hf: replaces the ones checkpoint.json records)")
        p.add_argument("--custom_import", action="append", default=[],
                       help="module registering the model (as [job] custom_import)")
    args = parser.parse_args(argv)

    try:
        import_custom_modules(args.custom_import)
        source = args.checkpoint if args.command == "to_hf" else args.hf_folder
        spec = model_of_folder(source, args.model)
        if spec.hf_adapter is None:
            raise ValueError(f"model {spec.name!r} has no HuggingFace adapter")
        overrides = overrides_from_cli(args.override)
        if args.command == "to_hf":
            model, model_args = model_from_checkpoint(spec, args.checkpoint, args.flavor,
                                                      overrides)
            files = save_hf(model.state_dict(), spec.hf_adapter(model_args), args.output,
                            DTYPES[args.dtype], int(args.max_shard_gb * 2**30))
            add_generation_files(args.output, args.tokenizer_path)
            print(f"wrote {args.output}/config.json, {len(files)} safetensors file(s), the "
                  "tokenizer files and generation_config.json")
        else:
            final, flavor = hf_to_seed_checkpoint(spec, args.hf_folder, args.checkpoint_folder,
                                                  args.flavor, overrides)
            print(f"wrote the seed checkpoint {final} ({spec.name} flavor {flavor})")
    except (ValueError, CheckpointError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
