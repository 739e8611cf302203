import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A generated corpus (JSONL) the tests train on: no download, same bytes every run."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(path)
    return path
