"""Prepared (tokenize-once) datasets: the format, the per-rank reads, shuffle, mixtures, resume.

Everything here is exact integer bookkeeping, so every comparison is bitwise.
"""

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import ROOT, env, write_corpus

from torchtitan_like.components.data.datasets import PackedDataset
from torchtitan_like.components.data.mixture import MixtureSchedule
from torchtitan_like.components.data.prepare import prepare
from torchtitan_like.components.data.prepared import split_files, token_dtype
from torchtitan_like.components.data.sources import DataError, build_document_source
from torchtitan_like.components.data.tokenized import TokenizedLoader
from torchtitan_like.components.data.tokenizer import ByteTokenizer
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.validate import validate

SEQ = 64


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "web"
    prepare([corpus], "", out, workers=1, progress=None)
    return out


def loader(folder: Path, **kwargs) -> TokenizedLoader:
    options = {"split": "train", "seq_len": SEQ, "local_batch_size": 2, "dp_rank": 0,
               "dp_degree": 1, "seed": 0, "shuffle": False, **kwargs}
    return TokenizedLoader({folder.name: folder}, {folder.name: 1.0}, **options)


def batches(data, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(itertools.islice(iter(data), n))


def global_batches(folder: Path, dp: int, n: int, local: int = 2, **kwargs) -> list[torch.Tensor]:
    """Each step's global batch (inputs of all ranks, in rank order) under ``dp`` ranks."""
    ranks = [batches(loader(folder, dp_rank=r, dp_degree=dp, local_batch_size=local, **kwargs),
                     n) for r in range(dp)]
    return [torch.cat([ranks[r][i][0] for r in range(dp)]) for i in range(n)]


def test_token_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert [token_dtype(v).name for v in (256, 257, 65536, 65537)] == [
        "uint8", "uint16", "uint16", "uint32"]


def test_parallel_preparation_is_identical_and_a_rerun_is_a_no_op(corpus, prepared, tmp_path):
    result = prepare([corpus], "", tmp_path / "two", workers=2, progress=None)
    assert not result.skipped and result.manifest["dtype"] == "uint16"
    for split in ("train", "validation"):
        for one, two in zip(split_files(prepared, split), split_files(tmp_path / "two", split),
                            strict=True):
            assert one.read_bytes() == two.read_bytes()
    tokens = np.fromfile(split_files(prepared, "train")[0], dtype=np.uint16)
    offsets = np.load(split_files(prepared, "train")[1])
    assert offsets[-1] == len(tokens) == result.manifest["splits"]["train"]["tokens"]
    assert (tokens[offsets[:-1]] == ByteTokenizer.bos_id).all()
    assert (tokens[offsets[1:] - 1] == ByteTokenizer.eos_id).all()
    again = prepare([corpus], "", tmp_path / "two", workers=2, progress=None)
    assert again.skipped and again.manifest == result.manifest


@pytest.mark.parametrize("split", ["train", "validation"])
def test_samples_equal_the_on_the_fly_packing(corpus, prepared, split):
    """Same documents, same split, same packing: every rank's samples are bitwise equal, also
    past the end of a pass (1200 samples of 65 tokens > the 73k-token train stream)."""
    for dp in (1, 2):
        for rank in range(dp):
            source = build_document_source("local", str(corpus), "text")
            fly = PackedDataset(source, ByteTokenizer(), seq_len=SEQ, local_batch_size=2,
                                dp_rank=rank, dp_degree=dp, split=split, holdout_every=50)
            expected = list(itertools.islice(iter(fly), 1200 // dp))
            got = batches(loader(prepared, split=split, dp_rank=rank, dp_degree=dp), 600 // dp)
            for i, (inputs, labels) in enumerate(got):
                for j in range(2):
                    assert torch.equal(inputs[j], expected[2 * i + j][0])
                    assert torch.equal(labels[j], expected[2 * i + j][1])


def test_each_rank_reads_only_its_own_samples(prepared):
    """Per step a rank reads local_batch x (seq_len + 1) tokens of 2 bytes, whatever dp."""
    for dp in (1, 2, 4):
        data = loader(prepared, dp_rank=dp - 1, dp_degree=dp)
        batches(data, 10)
        assert data.bytes_read() == 10 * 2 * (SEQ + 1) * 2


def test_every_layout_sees_the_same_global_batch(prepared):
    for shuffle in (False, True):
        reference = global_batches(prepared, 1, 20, local=4, shuffle=shuffle)
        for dp in (2, 4):
            got = global_batches(prepared, dp, 20, local=4 // dp, shuffle=shuffle)
            assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))


def test_shuffle_is_a_seeded_permutation_of_each_block(prepared):
    data = loader(prepared, shuffle=True, seed=3)
    per_block = data.sources[0].per_block
    offsets = [data.sources[0].offset(i) for i in range(2 * per_block)]
    assert sorted(offsets) == [p * (SEQ + 1) for p in range(2 * per_block)]
    assert sorted(offsets[:per_block]) == [p * (SEQ + 1) for p in range(per_block)]
    assert offsets[:per_block] != sorted(offsets[:per_block])
    same = loader(prepared, shuffle=True, seed=3).sources[0]
    other = loader(prepared, shuffle=True, seed=4).sources[0]
    assert [same.offset(i) for i in range(50)] == offsets[:50]
    assert [other.offset(i) for i in range(50)] != offsets[:50]


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_across_dp_degrees_and_with_workers_is_exact(prepared, shuffle):
    """A position saved by one process (batch 4) after 5 steps, mid-iteration with 2 workers
    reading ahead, is continued by 2 ranks (batch 2 each, 2 workers) with the same global
    batches as the uninterrupted run."""
    reference = global_batches(prepared, 1, 12, local=4, shuffle=shuffle)
    first = loader(prepared, local_batch_size=4, shuffle=shuffle, num_workers=2)
    assert all(torch.equal(b[0], r) for b, r in zip(batches(first, 5), reference, strict=False))
    state = first.state_dict()
    ranks = []
    for rank in range(2):
        resumed = loader(prepared, dp_rank=rank, dp_degree=2, shuffle=shuffle, num_workers=2)
        resumed.load_state_dict(state)
        ranks.append(batches(resumed, 7))
    for i in range(7):
        assert torch.equal(torch.cat([ranks[0][i][0], ranks[1][i][0]]), reference[5 + i])


def test_another_seq_len_continues_at_the_first_unread_token(prepared):
    first = loader(prepared)
    batches(first, 3)  # 6 samples of 65 tokens
    shorter = loader(prepared, seq_len=31)
    shorter.load_state_dict(first.state_dict())
    stream = np.fromfile(split_files(prepared, "train")[0], dtype=np.uint16).astype(np.int64)
    inputs, _ = batches(shorter, 1)[0]
    assert torch.equal(inputs[0], torch.from_numpy(stream[6 * 65 : 6 * 65 + 31]))
    shuffled = loader(prepared, shuffle=True)
    batches(shuffled, 1)
    with pytest.raises(DataError, match="shuffled stream"):
        loader(prepared, seq_len=31, shuffle=True).load_state_dict(shuffled.state_dict())


@pytest.mark.parametrize("weights", [[0.75, 0.25], [0.5, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4],
                                     [1 / 3, 1 / 3, 1 / 3], [0.7, 0.0, 0.3]])
def test_schedule_holds_every_prefix_within_one_sample(weights):
    schedule = MixtureSchedule({f"s{i}": w for i, w in enumerate(weights)}, seed=0)
    shares = list(schedule.shares().values())
    for n in range(1, 5001):
        schedule.next()
        assert all(abs(c - s * n) < 1 for c, s in zip(schedule.counts, shares, strict=True)), n
    assert [c for c, w in zip(schedule.counts, weights, strict=True) if w == 0] in ([], [0])


def test_mixture_proportions_and_a_zero_weight_source_is_never_read(corpus, prepared, tmp_path):
    write_corpus(tmp_path / "code.jsonl", documents=100, seed=1)
    prepare([tmp_path / "code.jsonl"], "", tmp_path / "code", workers=1, progress=None)
    folders = {"web": prepared, "code": tmp_path / "code", "books": tmp_path / "code"}
    data = TokenizedLoader(folders, {"web": 0.75, "code": 0.25, "books": 0.0}, split="train",
                           seq_len=SEQ, local_batch_size=2, dp_rank=0, dp_degree=2, seed=0,
                           shuffle=False)
    for step, _ in zip(range(1, 51), data, strict=False):
        web, code, books = data.tokens
        assert abs(web - 0.75 * 4 * step * SEQ) < SEQ and abs(code - 0.25 * 4 * step * SEQ) < SEQ
        assert books == 0
    assert data.splits[2].bytes_read == 0
    metrics = data.mixture_metrics()
    assert metrics["data_share/web"] == 0.75 and metrics["data_tokens/code"] == 50 * SEQ


def test_mixture_from_the_command_line_and_tokenizer_mismatch_is_refused(prepared, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    base = ["--model.flavor", "tiny", "--training.dataset", "tokenized",
            "--training.dataset_path", str(prepared.parent)]
    config = build_job_config([*base, "--training.mixture", "web=0.7, code=0.3"])
    assert config.training.mixture == {"web": 0.7, "code": 0.3}
    with pytest.raises(ConfigError, match="code: not a prepared dataset"):
        validate(config, 1)
    config = build_job_config([*base, "--training.mixture", "web=1",
                               "--model.tokenizer_path", str(tmp_path)])
    with pytest.raises(ConfigError, match=r"was tokenized by tokenizer byte \(258 tokens\) but"):
        validate(config, 1)
    for extra, message in ((["--training.holdout_every", "10"], "holdout_every = 50"),
                           (["--training.mixture", "web=-1"], "must be >= 0")):
        with pytest.raises(ConfigError, match=message):
            validate(build_job_config([*base, "--training.mixture", "web=1", *extra]), 1)


def test_prepare_data_script(corpus, tmp_path):
    cmd = [sys.executable, "scripts/prepare_data.py", str(corpus), "--out", str(tmp_path / "o"),
           "--workers", "1"]
    first = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True)
    assert "up to date, nothing to do" in again.stdout
    bad = subprocess.run([*cmd[:2], str(tmp_path / "missing"), *cmd[3:]], cwd=ROOT, env=env(),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("missing does not exist")


def test_new_weights_continue_each_source_at_its_first_unread_token(prepared, tmp_path):
    write_corpus(tmp_path / "code.jsonl", documents=100, seed=1)
    prepare([tmp_path / "code.jsonl"], "", tmp_path / "code", workers=1, progress=None)
    folders = {"web": prepared, "code": tmp_path / "code"}

    def mixture(weights):
        return TokenizedLoader(folders, weights, split="train", seq_len=SEQ, local_batch_size=4,
                               dp_rank=0, dp_degree=1, seed=0, shuffle=False)

    first = mixture({"web": 0.75, "code": 0.25})
    batches(first, 2)  # 8 samples: 6 of web, 2 of code
    after = mixture({"web": 0.25, "code": 0.75})
    after.load_state_dict(first.state_dict())
    assert [s.origin for s in after.sources] == [6 * (SEQ + 1), 2 * (SEQ + 1)]
    assert after.tokens == first.tokens and after.schedule.samples == 0
