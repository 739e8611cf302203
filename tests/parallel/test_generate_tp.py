"""Tensor-parallel generation (scripts/generate.py --tp 2 on 2 ranks) gives the tokens of
one process.

TP changes only the order of floating-point sums (the row-wise matmuls' all-reduce), a few
1e-6 on fp32 logits of order 1; greedy tokens then agree unless two top logits are that close.
The test measures the smallest top-2 gap along the one-process output and requires > 1e-4, so
a mismatch means a wrong split or padding, not a near-tie. The sequence is padded on the right
to a multiple of the TP degree (sequence parallel shards it); causal attention keeps the pad
out of the real positions, which the exact agreement also checks.
"""

import torch
from harness import ranks

from torchtitan_like.components.data.tokenizer import ByteTokenizer
from torchtitan_like.components.hf_checkpoint import save_hf
from torchtitan_like.components.hf_export import add_generation_files
from torchtitan_like.models.llama3 import Llama3HFAdapter, Transformer, llama3_flavors
from torchtitan_like.tools.generate import generate, load_model, prompt_ids

PROMPT = "The model "
NEW_TOKENS = 12


def test_tp2_generates_the_tokens_of_one_process(tmp_path):
    args = llama3_flavors["tiny"]
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights()
    save_hf(model.state_dict(), Llama3HFAdapter(args), tmp_path, torch.float32)
    add_generation_files(tmp_path, "")

    one, max_seq_len = load_model(tmp_path)
    byte = ByteTokenizer()
    ids = prompt_ids(byte, PROMPT)
    ours = generate(one, ids, max_new_tokens=NEW_TOKENS, max_seq_len=max_seq_len,
                    eos_id=byte.eos_id)
    with torch.no_grad():
        top2 = one(torch.tensor([ids + ours[:-1]]))[0, len(ids) - 1:].topk(2).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-4

    proc = ranks(2, "scripts/generate.py", str(tmp_path), "--tp", "2", "--prompt", PROMPT,
                    "--max_new_tokens", str(NEW_TOKENS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.rstrip("\n").endswith(PROMPT + byte.decode(ours))
