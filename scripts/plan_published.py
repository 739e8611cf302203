"""Print the planner's predictions beside published training runs (the table of
docs/planner-throughput.md): python scripts/plan_published.py"""

from torchtitan_like.tools.planner.published import markdown_table

if __name__ == "__main__":
    print(markdown_table())
