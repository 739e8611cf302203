"""ExpertParallel alone, on GroupedExperts (loop and grouped GEMM) behind a dense layer:
2 processes, EP = 2, one launch.

The worker (ep_style_worker.py) checks, for two steps, each rank's outputs and every gradient
(experts sharded over ep, a dense layer FSDP-sharded beside them) against the one-process
module on the same tokens, then gradient clipping over the two meshes. Step 1 routes all of
rank 0's tokens to its own experts (it sends nothing to rank 1) and gives expert 3 no token.
Tolerances are derived in the worker's ``close``.
"""

from pathlib import Path

from harness import ranks

WORKER = Path(__file__).parent / "ep_style_worker.py"


def test_expert_parallel_matches_one_process():
    proc = ranks(2, str(WORKER), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    checks = [line for line in proc.stdout.splitlines() if line.startswith("CHECK")]
    assert len(checks) == 32 and all(line.endswith(" ok") for line in checks), checks
