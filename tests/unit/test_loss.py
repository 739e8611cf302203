"""Normalising by the global token count makes accumulation exact, whatever the split."""

import torch

from torchtitan_like.protocols.loss import IGNORE_INDEX, count_labelled_tokens, cross_entropy_sum


def test_microbatch_sums_equal_the_whole_batch_in_loss_and_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(6, 5, 8)
    labels = torch.randint(0, 11, (6, 5))
    labels[0, :4] = IGNORE_INDEX  # microbatches with unequal numbers of labelled tokens
    labels[3, 1] = IGNORE_INDEX

    total = count_labelled_tokens(labels)
    whole = cross_entropy_sum(head(hidden), labels) / total
    whole.backward()
    expected_grad = head.weight.grad.clone()
    head.weight.grad = None

    split = sum(cross_entropy_sum(head(h), y) / total
                for h, y in zip(hidden.split([1, 2, 3]), labels.split([1, 2, 3]), strict=True))
    split.backward()
    # The same terms summed in another order (class b): at worst (n + 5) roundings of 2^-24
    # for n = 25 tokens, times the mean loss 2.7: 4.8e-6 (measured 4.8e-7, 2 ulps).
    assert torch.allclose(split, whole, atol=5e-6)
    assert torch.allclose(head.weight.grad, expected_grad, atol=1e-6)  # grads < 0.2: 60 ulps
    assert torch.allclose(whole, torch.nn.functional.cross_entropy(
        head(hidden).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX), atol=1e-6)


def test_per_microbatch_mean_would_differ():
    """The naive alternative (mean per microbatch, then averaged) weights tokens unequally."""
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    labels = torch.randint(0, 7, (2, 4))
    labels[0, 1:] = IGNORE_INDEX
    exact = cross_entropy_sum(logits, labels) / count_labelled_tokens(labels)
    naive = sum(cross_entropy_sum(x, y) / count_labelled_tokens(y)
                for x, y in zip(logits.split(1), labels.split(1), strict=True)) / 2
    assert not torch.allclose(exact, naive)
