"""Data problems found only while reading are one ``DataError`` line naming the file and line
(the trainer prints it as ``data error: ...``); text is strict UTF-8 unless
``decode_errors = "replace"``; ``.json`` is JSON lines for the trainer and prepare_data.py
alike; prepare_data.py refuses a held-out split it cannot fill, writing nothing."""

import json

import numpy as np
import pytest
from harness import ROOT

from torchtitan_like.components.data.dataloader import build_dataloader
from torchtitan_like.components.data.prepare import prepare
from torchtitan_like.components.data.prepared import MANIFEST
from torchtitan_like.components.data.sources import DataError, build_document_source
from torchtitan_like.components.data.tokenizer import ByteTokenizer
from torchtitan_like.config.job_config import Training


def _lines(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _read(path, errors="strict", field="text"):
    return list(build_document_source("local", str(path), field, errors)())


def _one_line_error(path, match, **kwargs) -> None:
    with pytest.raises(DataError, match=match) as error:
        _read(path, **kwargs)
    assert "\n" not in str(error.value)


def test_a_bad_record_deep_in_a_file_names_file_and_line(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text(_lines({"text": "a"}, {"text": "b"}, "{not json"))
    _one_line_error(path, r"late\.jsonl:3: not valid JSON")
    path.write_text(_lines({"text": "a"}, {"text": "b"}, {"text": "c"}, {"body": "d"}))
    _one_line_error(path, r"late\.jsonl:4: no text field 'text' in this record")


def test_the_training_stream_raises_the_same_error(tmp_path):
    """The first batch needs the bad record: the loader raises the DataError as it is."""
    path = tmp_path / "late.jsonl"
    path.write_text(_lines(*({"text": "x" * 40} for _ in range(3)), {}))
    training = Training(dataset="local", dataset_path=str(path), seq_len=64, local_batch_size=4,
                        holdout_every=0)
    loader = build_dataloader(training, ByteTokenizer(), dp_rank=0, dp_degree=1)
    with pytest.raises(DataError, match=r"late\.jsonl:4: no text field"):
        next(iter(loader))


def test_text_is_strict_utf8_unless_replace_is_asked_for(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"line one\nline \xe9two\n")
    _one_line_error(tmp_path / "a.txt", r"a\.txt:2: byte 0xe9 at column 6 is not UTF-8")
    assert _read(tmp_path / "a.txt", errors="replace") == ["line one\nline \ufffdtwo\n"]
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    _one_line_error(tmp_path / "b.jsonl", r"b\.jsonl:2: byte 0xff at column 11 is not UTF-8")
    assert _read(tmp_path / "b.jsonl", errors="replace") == ["ok", "\ufffd"]


def test_json_is_json_lines_and_a_json_array_is_explained(tmp_path):
    (tmp_path / "data.json").write_text(_lines({"text": "one"}, {"text": "two"}))
    assert _read(tmp_path) == ["one", "two"]
    (tmp_path / "data.json").write_text(json.dumps([{"text": "one"}, {"text": "two"}], indent=1))
    _one_line_error(tmp_path / "data.json", r"data\.json:1: not valid JSON .*one JSON object per")


def test_unreadable_files_are_data_errors(tmp_path):
    (tmp_path / "folder.jsonl").mkdir()  # a folder named like a data file
    _one_line_error(tmp_path, r"folder\.jsonl: cannot be read")
    pytest.importorskip("pyarrow", reason="optional extra `parquet` not installed")
    (tmp_path / "folder.jsonl").rmdir()
    (tmp_path / "x.parquet").write_text("not parquet")
    _one_line_error(tmp_path / "x.parquet", r"x\.parquet: not a readable Parquet file")


def test_prepare_reads_json_and_records_the_largest_id(tmp_path):
    (tmp_path / "data.json").write_text(_lines(*({"text": f"doc {i} ~"} for i in range(6))))
    manifest = prepare([tmp_path / "data.json"], "", tmp_path / "out", holdout_every=3,
                       workers=1, progress=None).manifest
    train = np.fromfile(tmp_path / "out/train.bin", dtype=np.uint16)
    assert manifest["splits"]["train"]["max_id"] == int(train.max()) == 257  # EOS
    assert manifest["splits"]["validation"]["documents"] == 2


def test_prepare_refuses_a_held_out_split_it_cannot_fill(tmp_path, capsys):
    import runpy
    import sys

    (tmp_path / "few.jsonl").write_text(_lines(*({"text": f"doc {i}"} for i in range(3))))
    with pytest.raises(DataError, match=r"3 document\(s\), so holdout_every = 50 holds none out"):
        prepare([tmp_path / "few.jsonl"], "", tmp_path / "out", workers=1, progress=None)
    assert not (tmp_path / "out" / MANIFEST).exists() and not list((tmp_path / "out").glob("*"))
    argv = ["prepare_data.py", str(tmp_path / "few.jsonl"), "--out", str(tmp_path / "o"),
            "--workers", "1"]
    saved, sys.argv = sys.argv, argv
    try:
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(ROOT / "scripts/prepare_data.py"), run_name="__main__")
    finally:
        sys.argv = saved
    errors = [line for line in capsys.readouterr().err.splitlines() if "prepare_data:" in line]
    assert exit_.value.code == 2 and len(errors) == 1 and "holds none out" in errors[0]


def test_a_prepared_file_cut_short_after_start_up_is_a_data_error(tmp_path):
    from torchtitan_like.components.data.prepared import PreparedSplit

    (tmp_path / "d.jsonl").write_text(_lines(*({"text": f"doc {i}"} for i in range(4))))
    prepare([tmp_path / "d.jsonl"], "", tmp_path / "out", holdout_every=0, workers=1,
            progress=None)
    split = PreparedSplit(tmp_path / "out", "train")
    (tmp_path / "out/train.bin").write_bytes(b"\0\0")
    with pytest.raises(DataError, match=r"train\.bin: cannot be read as \d+ ids of uint16"):
        split.read(0, 4)
