"""The loss hook's autograd carrier and the metric hook (protocols/step_hooks.py).

Everything in float64 on one process: the hooked model and the reference compute the same
operations on the same numbers, so gradients agree to float64 rounding of a reordered sum
(1e-12 is ~1e4 ulp of these O(1) values, far below any real error such as a term counted twice).
"""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from torchtitan_like.protocols.step_hooks import StepHooks, attach_step_hooks

TOL = 1e-12
COEF = 0.1
ONE_RANK = SimpleNamespace(size=lambda: 1, device_type="cpu")  # a size-1 mesh dim


class ZBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8, dtype=torch.float64)
        self.step_hooks = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.linear(x))
        if self.step_hooks is not None:
            z = torch.logsumexp(h, dim=-1)
            h = self.step_hooks.add_loss("z", h, COEF * (z**2).sum())
            self.step_hooks.record_metric("z_max", z.detach().amax(), reduce="max")
            self.step_hooks.record_metric("z_mean", z.detach().mean(), reduce="mean")
            self.step_hooks.record_metric("pair", torch.stack([z.sum(), z.new_tensor(z.numel())]),
                                          derive=lambda t: float(t[0] / t[1]))
        return h


def reference_grads(block: ZBlock, batches: list[torch.Tensor], tokens: int) -> list:
    """Gradients of (sum(h) + COEF * sum(z^2)) / tokens written out by hand."""
    block.zero_grad()
    for x in batches:
        h = torch.tanh(block.linear(x))
        ((h.sum() + COEF * (torch.logsumexp(h, -1) ** 2).sum()) / tokens).backward()
    return [p.grad.clone() for p in block.parameters()]


def hooked_step(model: nn.Module, hooks: StepHooks, batches: list[torch.Tensor], tokens: int):
    """One step as the trainer runs it: forwards recorded, backwards outside."""
    model.zero_grad()
    hooks.begin_step(torch.tensor(tokens))
    for x in batches:
        with hooks.recording():
            out = model(x)
        (out.sum() / tokens).backward()
    hooks.end_step()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("wrap", ["eager", "full_ac", "compiled_full_ac"])
def test_gradient_is_that_of_adding_the_term_divided_by_global_tokens(wrap):
    # dynamo's own patch(), not monkeypatch: monkeypatch would restore the config entry by
    # deleting it (it is not in the module's __dict__), hiding it from every later compile.
    # As distributed/compile.py sets it:
    skip_side_effects = torch._dynamo.config.patch(
        skip_fwd_side_effects_in_bwd_under_checkpoint=wrap == "compiled_full_ac")
    with skip_side_effects:
        _check_hooked_gradients(wrap)


def _check_hooked_gradients(wrap: str) -> None:
    torch.manual_seed(0)
    block = ZBlock()
    batches = [torch.randn(3, 5, 8, dtype=torch.float64) for _ in range(2)]
    expected = reference_grads(block, batches, tokens=11)
    model: nn.Module = block
    if wrap != "eager":
        model = checkpoint_wrapper(block, preserve_rng_state=False)
    if wrap == "compiled_full_ac":  # dynamo tracing of the hooks; aot_eager skips codegen
        model.compile(backend="aot_eager", fullgraph=True)
    hooks = StepHooks()
    assert attach_step_hooks(model, hooks) == 1
    for _ in range(2):  # the second step must not see the first's values
        actual = hooked_step(model, hooks, batches, tokens=11)
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a, e, atol=TOL, rtol=0)
        values, console = hooks.reduce(ONE_RANK, ONE_RANK)
        zs = [torch.logsumexp(torch.tanh(block.linear(x)), -1).detach() for x in batches]
        # logged once per forward, not again while checkpointing recomputes
        assert values["aux_loss/z"] == pytest.approx(sum(COEF * (z**2).sum() for z in zs) / 11)
        assert values["z_max"] == pytest.approx(max(z.max() for z in zs))
        assert values["z_mean"] == pytest.approx(sum(z.mean() for z in zs) / 2)
        assert values["pair"] == pytest.approx(torch.cat(zs).mean())
        assert console == ["aux_loss/z", "pair", "z_max", "z_mean"]


def test_shared_loss_gradients_split_the_gradient_not_the_logged_value():
    """Inside a local TP region of 2 ranks (distributed/local_tp.py) each rank adds half of a
    term's gradient (the region sums the two): exactly half, a power-of-two scaling; the
    logged value stays whole (TP replicas are not summed when logging)."""
    torch.manual_seed(0)
    block, hooks = ZBlock(), StepHooks()
    attach_step_hooks(block, hooks)
    x = torch.randn(3, 5, 8, dtype=torch.float64)

    def term_gradients(copies: int) -> tuple[list[torch.Tensor], float]:
        block.zero_grad()
        hooks.begin_step(torch.tensor(11))
        hooks.share_loss_gradients(copies)
        with hooks.recording():
            out = block(x)
        hooks.share_loss_gradients(1)
        (out.sum() * 0).backward()  # the carrier's own gradient is 0: the term's alone
        hooks.end_step()
        return [p.grad.clone() for p in block.parameters()], hooks.reduce(
            ONE_RANK, ONE_RANK)[0]["aux_loss/z"]

    whole, logged = term_gradients(1)
    halves, logged_shared = term_gradients(2)
    assert all(torch.equal(2 * h, w) for h, w in zip(halves, whole, strict=True))
    assert logged_shared == logged and any(w.abs().sum() > 0 for w in whole)


def test_outside_a_step_or_recording_the_module_is_plain():
    block, hooks = ZBlock(), StepHooks()
    attach_step_hooks(block, hooks)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    plain = torch.tanh(block.linear(x))
    torch.testing.assert_close(block(x), plain)  # no step open: nothing recorded
    hooks.begin_step(torch.tensor(6))
    block(x)  # a forward outside recording() (a pipeline's metadata inference)
    assert hooks.reduce(ONE_RANK, ONE_RANK) == ({}, [])


def test_vector_metrics_without_derive_are_logged_as_lists_not_on_the_console():
    hooks = StepHooks()
    hooks.begin_step(torch.tensor(4))
    with hooks.recording():
        hooks.record_metric("load", torch.tensor([1.0, 2.0]))
        hooks.record_metric("load", torch.tensor([3.0, 0.0]))
        hooks.record_metric("quiet", torch.tensor(1.0), console=False)
    assert hooks.reduce(ONE_RANK, ONE_RANK) == ({"load": [4.0, 2.0], "quiet": 1.0}, [])
    with pytest.raises(ValueError, match="reduce must be one of"):
        hooks.record_metric("bad", torch.tensor(1.0), reduce="min")
