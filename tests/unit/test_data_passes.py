"""A dataset that runs out says so: each new pass over it is logged and counted (``epoch``,
which the trainer writes into metrics.jsonl), and the count survives a resume."""

import logging

from torchtitan_like.components.data.datasets import PackedDataset
from torchtitan_like.components.data.tokenizer import ByteTokenizer


def test_each_new_pass_is_logged_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="torchtitan_like")
    docs = ["abcdefgh"] * 3  # 3 x (8 + BOS + EOS) = 30 tokens a pass, 9 per sample
    dataset = PackedDataset(lambda: iter(docs), ByteTokenizer(), seq_len=8, local_batch_size=1,
                            dp_rank=0, dp_degree=1, name="three_docs")
    samples = iter(dataset)
    epochs = []
    for _ in range(8):
        next(samples)
        epochs.append(dataset.epoch)
    assert epochs == [0, 0, 0, 1, 1, 1, 2, 2]  # the 4th sample ends in the second pass
    assert "three_docs: every training document seen; epoch 1 (pass 2" in caplog.text
    assert "epoch 2 (pass 3" in caplog.text
    resumed = PackedDataset(lambda: iter(docs), ByteTokenizer(), seq_len=8, local_batch_size=1,
                            dp_rank=0, dp_degree=1)
    resumed.load_state_dict(dataset.state_dict())
    assert resumed.epoch == 2
