"""Packing, sample-level sharding, exact resume (also under another DP degree), sources."""

import itertools
import json

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_like.components.data.datasets import PackedDataset
from torchtitan_like.components.data.sources import (
    DataError,
    build_document_source,
    cpython_documents,
)
from torchtitan_like.components.data.tokenizer import ByteTokenizer

DOCS = [f"document number {i} " + "word " * (i % 7) for i in range(40)]


def loader(rank=0, dp=1, batch=4, seq_len=16, docs=DOCS, split="train", holdout=0):
    dataset = PackedDataset(lambda: iter(docs), ByteTokenizer(), seq_len=seq_len,
                            local_batch_size=batch, dp_rank=rank, dp_degree=dp, split=split,
                            holdout_every=holdout)
    return StatefulDataLoader(dataset, batch_size=batch)


def global_batches(dp, batch, steps, **kw):
    """Per step, the samples of all ranks (in rank order)."""
    iters = [iter(loader(rank, dp, batch, **kw)) for rank in range(dp)]
    return [torch.cat([next(it)[0] for it in iters]) for _ in range(steps)]


def test_samples_are_the_bos_doc_eos_stream_cut_into_seq_len_plus_one():
    tok = ByteTokenizer()
    stream = [t for d in DOCS for t in (tok.bos_id, *tok.encode(d), tok.eos_id)]
    inputs, labels = next(iter(loader(batch=6)))
    for i in range(6):
        window = stream[i * 17 : (i + 1) * 17]
        assert inputs[i].tolist() == window[:-1] and labels[i].tolist() == window[1:]


@pytest.mark.parametrize(("dp", "batch"), [(2, 2), (4, 1)])
def test_global_batch_is_independent_of_the_dp_degree(dp, batch):
    expected = global_batches(1, 4, steps=5)
    for a, b in zip(global_batches(dp, batch, steps=5), expected, strict=True):
        assert torch.equal(a, b)


def test_resume_is_exact():
    dl = loader(rank=1, dp=2, batch=2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    expected = [next(it)[0] for _ in range(4)]
    resumed = loader(rank=1, dp=2, batch=2)
    resumed.load_state_dict(state)
    got = list(itertools.islice(iter(resumed), 4))
    assert all(torch.equal(g[0], e) for g, e in zip(got, expected, strict=True))


def test_state_at_a_batch_boundary_is_the_same_on_every_rank_and_layout():
    """So a run saved at DP=2 resumes at DP=1 (same global batch) on the same samples."""
    ranks = [loader(rank, dp=2, batch=2) for rank in range(2)]
    iters = [iter(dl) for dl in ranks]
    for _ in range(3):
        for it in iters:
            next(it)
    states = [dl.dataset.state_dict() for dl in ranks]
    assert states[0] == states[1]
    single = loader(dp=1, batch=4)
    single.dataset.load_state_dict(states[0])
    assert torch.equal(next(iter(single))[0], torch.cat([next(it)[0] for it in iters]))


def test_holdout_split_is_disjoint_and_every_nth_document():
    train = loader(batch=1, seq_len=2000, docs=DOCS, holdout=5)
    val = loader(batch=1, seq_len=2000, docs=DOCS, holdout=5, split="validation")
    decode = ByteTokenizer().decode
    train_text, val_text = decode(next(iter(train))[0][0].tolist()), decode(
        next(iter(val))[0][0].tolist())
    assert "document number 4 " in val_text and "document number 9 " in val_text
    assert "document number 4 " not in train_text and "document number 3 " in train_text


def test_empty_split_is_a_clear_error():
    with pytest.raises(DataError, match="validation split has no documents"):
        next(iter(loader(docs=DOCS[:3], split="validation", holdout=5)))


def test_local_sources(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("text file")
    (tmp_path / "sub" / "b.jsonl").write_text(
        json.dumps({"text": "first"}) + "\n\n" + json.dumps({"text": "second"}) + "\n")
    (tmp_path / "ignored.md").write_text("not read")
    docs = list(build_document_source("local", str(tmp_path), "text")())
    assert docs == ["text file", "first", "second"]


def test_bad_jsonl_records_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"content": "x"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: no text field 'text'"):
        list(build_document_source("local", str(path), "text")())
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: not valid JSON"):
        list(build_document_source("local", str(path), "text")())


def test_parquet_source(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="optional extra `parquet` not installed")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["one", None, "two"]}), tmp_path / "d.parquet")
    assert list(build_document_source("local", str(tmp_path), "body")()) == ["one", "two"]
    with pytest.raises(DataError, match="no column 'text'"):
        list(build_document_source("local", str(tmp_path), "text")())


def test_cpython_documents_are_real_text():
    docs = cpython_documents()
    assert len(docs) > 100 and sum(map(len, docs)) > 500_000
    assert any("for" in d and "statement" in d for d in docs)
