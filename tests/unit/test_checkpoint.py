"""Checkpoint discovery, atomicity and every load error, in one process (a gloo group of one).

A base run saves step-2 and step-4; each test copies its checkpoint folder, damages or changes
something, and builds a Trainer (which loads in its constructor).
"""

import errno
import json
import os
import shutil

import pytest
import torch
from harness import build_trainer, read_metrics
from torch.distributed.checkpoint import FileSystemReader

from torchtitan_like.components.checkpoint import CheckpointError, manager
from torchtitan_like.components.checkpoint.folder import partial_name, purge, recover, step_folders

CKPT = ["--checkpoint.enable", "true", "--checkpoint.interval", "2", "--training.steps", "4"]


@pytest.fixture(scope="module")
def base(one_process_group, corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    trainer = build_trainer(CKPT, folder, corpus, one_process_group)
    trainer.train()
    return folder, {k: v.clone() for k, v in trainer.model_parts[0].state_dict().items()}


@pytest.fixture
def job(base, corpus, one_process_group, tmp_path):
    """A copy of the base run's dump folder, and a function building a Trainer on it."""
    shutil.copytree(base[0] / "checkpoint", tmp_path / "checkpoint")

    def build(*overrides: str, folder=tmp_path):
        return build_trainer([*CKPT, *overrides], folder, corpus, one_process_group)

    return tmp_path / "checkpoint", build


def test_resumes_from_the_latest_or_the_chosen_step(job, base):
    folder, build = job
    assert sorted(step_folders(folder)) == [2, 4]
    info = json.loads((folder / "step-4" / "checkpoint.json").read_text())
    assert info["states"] == ["model", "optimizer", "lr_scheduler", "dataloader", "train_state"]
    assert info["model"] == {"name": "llama3", "flavor": "tiny", "overrides": {}}  # for export
    trainer = build()
    assert (trainer.step, trainer.tokens_seen) == (4, 4 * 4 * 64)
    for key, value in trainer.model_parts[0].state_dict().items():
        assert torch.equal(value, base[1][key]), key
    assert build("--checkpoint.load_step", "2").step == 2
    with pytest.raises(CheckpointError, match=r"load_step = 3: no complete checkpoint step-3 .*"
                                              r"\(complete: 2, 4\)"):
        build("--checkpoint.load_step", "3")


def test_unfinished_saves_are_ignored_and_removed(job):
    folder, build = job
    (folder / "step-6.partial").mkdir()
    (folder / "step-6.partial" / "__0_0.distcp").write_bytes(b"half a save")
    (folder / "step-4").rename(folder / "step-4.old")  # killed while replacing step-4
    assert build().step == 4
    assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-4"]


def test_a_writer_of_a_shared_folder_removes_only_its_own_unfinished_saves(tmp_path):
    """Replica groups share one checkpoint folder, each the writer of some steps: a group
    starting again removes its own cut-short save, never another group's save in flight."""
    for name in (partial_name(16, "replica_0"), partial_name(20, "replica_1")):
        (tmp_path / name).mkdir()
    recover(tmp_path, "replica_0")
    assert [p.name for p in tmp_path.iterdir()] == ["step-20.replica_1.partial"]
    recover(tmp_path)  # a plain job is the folder's one writer: every unfinished save goes
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / ".metadata").write_bytes(b"garbage"),
     r"corrupt: its \.metadata cannot be read"),
    (lambda p: (p / "__0_0.distcp").unlink(), r"corrupt: data file __0_0\.distcp is missing"),
    (lambda p: open(p / "__0_0.distcp", "r+b").truncate(1000),  # noqa: SIM115
     r"corrupt: data file __0_0\.distcp is truncated \(1000 bytes"),
    (lambda p: (p / "checkpoint.json").unlink(), r"checkpoint\.json is missing or unreadable"),
    (lambda p: _rot(p / "__0_0.distcp"), r"^step 4 \(.*step-4\) is damaged: "
                                         r"__0_0\.distcp bytes \d+-\d+ \(.*\) are not the "
                                         r"bytes saved: their CRC-32 differs \(found by rank 0\)"
                                         r"; to resume from the newest earlier complete "
                                         r"checkpoint instead, set \[checkpoint\] "
                                         r"fallback_on_damage = true"),
    (lambda p: _flip_one_bit(p / "__0_0.distcp"), r"step 4 .* is damaged: __0_0\.distcp bytes "
                                                  r"\d+-\d+ \(model\.layers\.1\.attention\.wq"
                                                  r"\.weight\) are not the bytes saved"),
    (lambda p: (p / "checksums.json").write_text("{"), r"corrupt: checksums\.json is unreadable"),
])
def test_a_corrupt_checkpoint_stops_the_run(job, damage, message):
    folder, build = job
    damage(folder / "step-4")
    with pytest.raises(CheckpointError, match=message):
        build()
    assert sorted(step_folders(folder)) == [2, 4]  # nothing deleted


def _rot(path):
    """Bit rot: the bytes of the first stored tensor flipped, the file's size unchanged."""
    data = bytearray(path.read_bytes())
    data[40:80] = bytes(b ^ 0xFF for b in data[40:80])
    path.write_bytes(data)


def _flip_one_bit(path, state="model.layers.1.attention.wq.weight"):
    """One bit in the middle of a stored weight's bytes (its float32 data, checksums.json says
    where): the value stays finite and plausible, the kind of damage that trained on unnoticed
    before checksums."""
    items = json.loads((path.parent / "checksums.json").read_text())["items"][path.name]
    offset, length = next((o, n) for o, n, _, name in items if name == state)
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01
    path.write_bytes(data)


def test_a_damaged_checkpoint_falls_back_only_when_allowed(job, base):
    """With [checkpoint] fallback_on_damage: the newest earlier checkpoint loads instead (all
    its states, bitwise as if chosen), and the damaged one is kept aside as step-4.damaged."""
    folder, build = job
    _flip_one_bit(folder / "step-4" / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"step 4 .* is damaged"):
        build()
    assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-4"]
    trainer = build("--checkpoint.fallback_on_damage", "true")
    assert trainer.step == 2 and trainer.checkpointer.loaded_from == folder / "step-2"
    assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-4.damaged"]
    reference = build("--checkpoint.load_step", "2")
    for key, value in reference.model_parts[0].state_dict().items():
        assert torch.equal(trainer.model_parts[0].state_dict()[key], value), key
    optimizer = trainer.checkpointer.states["optimizer"].state_dict()
    for key, value in reference.checkpointer.states["optimizer"].state_dict().items():
        same = torch.equal(optimizer[key], value) if torch.is_tensor(value) else \
            optimizer[key] == value
        assert same, key
    _flip_one_bit(folder / "step-2" / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"step 2 .* is damaged: .*; no earlier complete "
                                              r"checkpoint to fall back to"):
        build("--checkpoint.fallback_on_damage", "true")


def test_a_checkpoint_saved_before_checksums_loads_saying_so(job, base, caplog):
    folder, build = job
    (folder / "step-4" / "checksums.json").unlink()
    with caplog.at_level("INFO", logger="torchtitan_like"):
        trainer = build()
    assert trainer.step == 4
    assert "step-4 was saved without checksums (by a version before them): its bytes load " \
           "unverified" in caplog.text
    for key, value in trainer.model_parts[0].state_dict().items():
        assert torch.equal(value, base[1][key]), key


@pytest.mark.parametrize("mode", ["disabled", "async"])
def test_a_full_disk_stops_the_run_naming_it_and_keeps_the_last_checkpoint(
        job, monkeypatch, mode):
    """The save of step 4 fails as a full disk makes it fail (ENOSPC from the writer): one
    CheckpointError line naming the disk, the step and the kept checkpoint; step-2 stays."""
    folder, build = job
    shutil.rmtree(folder / "step-4")

    class FullDisk(manager.ChecksumWriter):
        def write_data(self, plan, planner):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path / "x.distcp"))

    monkeypatch.setattr(manager, "ChecksumWriter", FullDisk)
    trainer = build("--checkpoint.async_mode", mode, "--training.steps", "6")  # 4: not the last
    assert trainer.step == 2
    with pytest.raises(CheckpointError) as error:
        trainer.train()
    message = str(error.value)
    assert message.startswith("step 4: the save failed on rank 0: no space left on the device "
                              "(the disk is full) (") and "step-4.partial/x.distcp" in message
    assert message.endswith("the last complete checkpoint step-2 is kept"), message
    assert "\n" not in message
    assert sorted(step_folders(folder)) == [2]


def test_another_model_is_refused_with_the_difference(job):
    _, build = job
    with pytest.raises(CheckpointError, match=r"saved by \[model\] llama3/tiny, this job runs "
                       r"llama3/debugmodel\) does not fit this job: \d+ missing, e\.g\. "
                       r"model\.layers\.4\..*of another shape, e\.g\. model\.tok_embeddings"):
        build("--model.flavor", "debugmodel")


def test_another_optimizer_needs_the_optimizer_excluded(job):
    """An AdamW checkpoint resumed by a Muon job: its states are another optimizer's; without
    them the job resumes with fresh Muon states."""
    _, build = job
    with pytest.raises(CheckpointError, match=r"saved with \[optimizer\] name = 'AdamW', this "
                       r"job uses 'Muon'; .*exclude_from_loading=optimizer\) does not fit this "
                       r"job: \d+ missing, e\.g\. optimizer\.state\..*momentum_buffer"):
        build("--optimizer.name", "Muon")
    trainer = build("--optimizer.name", "Muon", "--checkpoint.exclude_from_loading", "optimizer")
    assert trainer.step == 4 and not trainer.optimizers.optimizers[0].state


def test_other_data_needs_the_dataloader_excluded(job, corpus, tmp_path):
    _, build = job
    other = tmp_path / "other.jsonl"
    shutil.copy(corpus, other)
    with pytest.raises(CheckpointError, match=r"refers to other data \(dataset_path: .*"
                                              r"exclude_from_loading=dataloader"):
        build("--training.dataset_path", str(other))
    trainer = build("--training.dataset_path", str(other),
                    "--checkpoint.exclude_from_loading", "dataloader")
    assert trainer.step == 4
    assert trainer.dataloader.state_dict()["dataset_state"]["position"]["doc"] == 0


def test_a_new_batch_shape_continues_the_stream(job):
    _, build = job
    trainer = build("--training.global_batch_size", "8", "--training.seq_len", "32")
    saved = json.loads(trainer.checkpointer.loaded_from.joinpath("checkpoint.json").read_text())
    assert (saved["global_batch_size"], saved["seq_len"]) == (4, 64)
    assert trainer.dataloader.state_dict()["dataset_state"]["position"]["offset"] > 0


def test_seed_checkpoint_then_purge_keeps_the_newest(one_process_group, corpus, tmp_path, base):
    seed = build_trainer([*CKPT, "--checkpoint.create_seed_checkpoint", "true"], tmp_path, corpus,
                         one_process_group)
    seed.train()
    folder = tmp_path / "checkpoint"
    assert json.loads((folder / "step-0" / "checkpoint.json").read_text())["states"] == ["model"]
    with pytest.raises(CheckpointError, match="writes step-0 into an empty folder"):
        build_trainer([*CKPT, "--checkpoint.create_seed_checkpoint", "true"], tmp_path, corpus,
                      one_process_group)
    trainer = build_trainer([*CKPT, "--checkpoint.interval", "1", "--checkpoint.keep_latest_k",
                             "2"], tmp_path, corpus, one_process_group)
    assert trainer.step == 0 and trainer.checkpointer.loaded_from == folder / "step-0"
    trainer.train()
    assert sorted(step_folders(folder)) == [0, 3, 4]  # the seed is no resumable checkpoint
    purge(folder, 1)
    assert sorted(step_folders(folder)) == [0, 4]
    losses = [r["loss"] for r in read_metrics(tmp_path) if "loss" in r]
    assert losses == [r["loss"] for r in read_metrics(base[0]) if "loss" in r]


def test_model_only_last_save(job):
    folder, build = job
    shutil.rmtree(folder / "step-4")
    trainer = build("--checkpoint.last_save_model_only", "true",
                    "--checkpoint.export_dtype", "bfloat16")
    assert trainer.step == 2
    trainer.train()
    info = json.loads((folder / "step-4" / "checkpoint.json").read_text())
    assert (info["states"], info["dtype"]) == (["model"], "bfloat16")
    metadata = FileSystemReader(str(folder / "step-4")).read_metadata()
    dtypes = {md.properties.dtype for md in metadata.state_dict_metadata.values()}
    assert dtypes == {torch.bfloat16}
    assert build().step == 2  # the export is not resumable; step-2 is
    shutil.rmtree(folder / "step-2")
    with pytest.raises(CheckpointError, match=r"only model-only checkpoints \(4\).*load_step"):
        build()
    assert build("--checkpoint.load_step", "4").step == 0  # its weights, a fresh start


def test_initial_load_path(base, corpus, one_process_group, tmp_path):
    trainer = build_trainer(["--checkpoint.initial_load_path",
                             str(base[0] / "checkpoint" / "step-4")], tmp_path, corpus,
                            one_process_group)
    assert trainer.step == 0
    for key, value in trainer.model_parts[0].state_dict().items():
        assert torch.equal(value, base[1][key]), key


def test_wrappers_leave_the_checkpoint_names_alone():
    """Activation checkpointing and per-block compile wrap blocks in place: the names a
    checkpoint holds stay those of the plain model (compiling happens lazily, not here)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from torchtitan_like.config.job_config import ActivationCheckpoint, Compile
    from torchtitan_like.distributed.activation_checkpoint import apply_ac
    from torchtitan_like.distributed.compile import apply_compile
    from torchtitan_like.models.llama3 import Transformer, llama3_flavors

    with torch.device("meta"):
        plain, wrapped = Transformer(llama3_flavors["tiny"]), Transformer(llama3_flavors["tiny"])
    apply_ac(wrapped.layers, ActivationCheckpoint(mode="full"))
    apply_compile(wrapped.layers, Compile(enable=True))
    assert any("_checkpoint_wrapped_module" in n for n, _ in wrapped.named_parameters())
    assert list(get_model_state_dict(wrapped)) == list(get_model_state_dict(plain))


def test_a_save_failure_without_an_errno_is_named_by_the_free_space(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as "unexpected pos": with less free space than
    the newest checkpoint takes it is a full disk (CheckpointError: not restarted), otherwise a
    plain error that a restart may cure (a peer that stopped answering)."""
    from collections import namedtuple

    from torch.distributed.checkpoint.api import CheckpointException

    from torchtitan_like.components.checkpoint import failure

    newest = tmp_path / "step-2"
    newest.mkdir()
    (newest / "__0_0.distcp").write_bytes(b"x" * 2**20)
    raised = CheckpointException("write", {1: (RuntimeError(
        "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), None)})
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(failure.shutil, "disk_usage", lambda p: usage(2**30, 2**30, 2**19))
    full = failure.save_failure(raised, 4, tmp_path, newest)
    assert isinstance(full, CheckpointError)
    assert str(full) == (f"step 4: the save failed on rank 1: only 0.5 MiB free on the file "
                         f"system of {tmp_path} (the newest checkpoint takes 1.0 MiB): the disk "
                         "is full; the last complete checkpoint step-2 is kept")  # no zip words
    first = failure.save_failure(raised, 2, tmp_path, None)  # no checkpoint yet: no size
    assert str(first).endswith(f"{tmp_path} (below 16 MiB): the disk is full; no complete "
                               "checkpoint exists yet")
    monkeypatch.setattr(failure.shutil, "disk_usage", lambda p: usage(2**40, 0, 2**39))
    other = failure.save_failure(raised, 4, tmp_path, newest)
    assert type(other) is RuntimeError and "rank 1: RuntimeError: [enforce fail" in str(other)
