"""Print the planner beside published training runs, held out and in sample, the fitted numbers
and what each does to the held-out table, and every row's source (the tables of
docs/planner-throughput.md): python scripts/plan_published.py

With --record, also rewrite torchtitan_like/tools/planner/heldout_record.py, the held-out table
ttl-plan reads for its error band (run it after changing the planner or a published row)."""

import argparse
from pathlib import Path

from torchtitan_like.tools.planner import holdout_tables
from torchtitan_like.tools.planner.holdout import held_out

RECORD = Path(holdout_tables.__file__).with_name("heldout_record.py")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=f"rewrite {RECORD.name}")
    args = parser.parse_args()
    if args.record:
        RECORD.write_text(holdout_tables.record_module(held_out()))
    print(holdout_tables.all_tables())
