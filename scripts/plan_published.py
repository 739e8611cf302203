"""Print the planner's predictions beside published training runs (the table of
docs/planner-throughput.md): python scripts/plan_published.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan_like.tools.planner.published import markdown_table

if __name__ == "__main__":
    print(markdown_table())
