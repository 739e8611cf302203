"""Rewrite docs/config_reference.md from the config dataclasses (their field docstrings).

    python scripts/config_reference.py          # update docs/config_reference.md in place
    python scripts/config_reference.py --check  # exit 1 if docs/config_reference.md is stale
"""

import sys
from pathlib import Path

from torchtitan_like.config.manager import reference_markdown

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def updated(page: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_markdown()}\n{END}{tail}"


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "docs" / "config_reference.md"
    text = path.read_text()
    if "--check" in sys.argv:
        sys.exit(0 if updated(text) == text else 1)
    path.write_text(updated(text))
