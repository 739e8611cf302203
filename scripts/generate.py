"""Sample from a checkpoint: python scripts/generate.py CHECKPOINT --prompt "The " [...]

See torchtitan_like/tools/generate.py (DCP or HuggingFace folders; greedy, temperature, top-k,
top-p; CPU or GPU; --tp N under torchrun); also: python -m torchtitan_like.tools.generate.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan_like.tools.generate import main

if __name__ == "__main__":
    raise SystemExit(main())
