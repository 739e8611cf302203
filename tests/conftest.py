import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Tests run on the CPU even on a GPU machine (test processes cannot share one GPU, and the parity
# bounds are derived for CPU fp32 kernels): hidden before torch initialises CUDA, and inherited by
# every torchrun launched from a test. docs/gpu.md has the GPU checks (scripts/gpu_smoke.sh).
os.environ["CUDA_VISIBLE_DEVICES"] = ""

from harness import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A generated corpus (JSONL) the tests train on: no download, same bytes every run."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(path)
    return path


@pytest.fixture(scope="module")
def one_process_group():
    """A gloo process group of one process inside the test process (for in-process Trainers);
    the environment and global torch settings are restored afterwards."""
    import os

    import torch
    import torch.distributed as dist

    from torchtitan_like.distributed.utils import init_distributed

    saved = dict(os.environ)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    device = init_distributed()
    yield device
    dist.destroy_process_group()
    torch.use_deterministic_algorithms(False)
    os.environ.clear()
    os.environ.update(saved)
