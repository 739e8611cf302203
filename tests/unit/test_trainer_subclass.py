"""A fork subclasses Trainer and runs it through main(trainer_cls=...): its overrides of
post_dataloading_process and forward_backward are the ones the loop calls. (The test calls
``run``, main's body: main then ends the process with run's exit code.)"""

from typing import ClassVar

from harness import job_args, read_metrics, run_in_process

from torchtitan_like.protocols.loss import IGNORE_INDEX
from torchtitan_like.train import Trainer


class FirstHalfOnly(Trainer):
    """Trains on the second half of each sequence only (labels of the first half ignored)."""

    calls: ClassVar[list[int]] = []

    def post_dataloading_process(self, inputs, labels):
        labels = labels.clone()
        labels[:, : labels.shape[1] // 2] = IGNORE_INDEX
        return inputs, labels

    def forward_backward(self, inputs, labels, global_tokens):
        FirstHalfOnly.calls.append(int(global_tokens))
        return super().forward_backward(inputs, labels, global_tokens)


def test_main_runs_the_subclass_and_its_overrides(tmp_path, corpus, monkeypatch):
    argv = job_args(["--training.steps=2", "--training.local_batch_size=4",
                     "--validation.enable=false"], tmp_path, corpus)
    assert run_in_process(argv, trainer_cls=FirstHalfOnly) == 0
    # global batch 4 x 64 tokens, half of them labelled, one microbatch per step
    assert FirstHalfOnly.calls == [4 * 32, 4 * 32]
    assert [r["step"] for r in read_metrics(tmp_path) if "loss" in r] == [1, 2]
