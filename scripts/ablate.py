"""Run an ablation sweep: python scripts/ablate.py train_configs/ablations/one_dim_at_a_time.toml

See torchtitan_like/tools/ablate.py (also runnable as python -m torchtitan_like.tools.ablate).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan_like.tools.ablate import main

if __name__ == "__main__":
    raise SystemExit(main())
