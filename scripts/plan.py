"""Plan a cluster run: python scripts/plan.py --flavor 70B --gpu H100 --num_gpus 512 ...

See torchtitan_like/tools/plan_cli.py and the tools/planner/ package; also runnable as
python -m torchtitan_like.tools.plan_cli.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan_like.tools.plan_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
