"""MoE building blocks: grouped GEMM vs the per-expert loop, routing, balancing, the aux loss.

Hand-computed cases are exact; comparisons of the two expert paths use 1e-5 in fp32 (the same
products summed in a different order by two kernels; values of order 1 over reductions of at
most 16 terms keep the difference near 1e-6)."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from torchtitan_like.models.moe import (
    GroupedExperts,
    MoE,
    MoEArgs,
    TokenChoiceTopKRouter,
    balance_experts,
    bias_update,
    limit_to_groups,
    sequence_balance_loss,
)
from torchtitan_like.protocols.step_hooks import StepHooks, attach_step_hooks


def _experts(use_grouped_mm: bool) -> GroupedExperts:
    torch.manual_seed(0)
    experts = GroupedExperts(dim=16, hidden_dim=8, num_experts=4, use_grouped_mm=use_grouped_mm)
    experts.init_weights(0.02)
    with torch.no_grad():  # order-1 outputs, so 1e-5 is a relative bound
        for w in (experts.w1, experts.w2, experts.w3):
            w.mul_(20)
    return experts


@pytest.mark.parametrize("counts", [[3, 0, 4, 1], [0, 0, 8, 0], [0, 0, 0, 0]])
def test_grouped_mm_equals_loop_with_empty_experts(counts):
    grouped, looped = _experts(True), _experts(False)
    x = torch.randn(sum(counts), 16)
    n = torch.tensor(counts)
    outs, grads = [], []
    for experts in (grouped, looped):
        xi = x.clone().requires_grad_()
        out = experts(xi, n)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        outs.append(out)
        grads.append([xi.grad, experts.w1.grad, experts.w2.grad, experts.w3.grad])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for g_grouped, g_looped in zip(*grads, strict=True):
        torch.testing.assert_close(g_grouped, g_looped, atol=1e-5, rtol=1e-5)
    for e, c in enumerate(counts):
        if c == 0:  # an expert without tokens gets an exact zero gradient
            assert grads[0][1][e].abs().sum() == 0


def test_group_limited_routing_hand_case():
    # 8 experts in 4 groups of 2. Sigmoid (DeepSeek-V3): a group scores the sum of its two
    # best experts: 0.9, 1.0, 0.8, 0.6 -> groups 1 and 0 are kept.
    scores = torch.tensor([[0.9, 0.0, 0.5, 0.5, 0.1, 0.7, 0.3, 0.3]])
    kept = limit_to_groups(scores, num_groups=4, num_limited=2, score_func="sigmoid")
    assert torch.isfinite(kept).tolist() == [[True] * 4 + [False] * 4]
    assert torch.equal(kept[:, :4], scores[:, :4])
    # Softmax (DeepSeek-V2): a group scores its best expert: 0.9, 0.5, 0.7, 0.3 -> 0 and 2.
    kept = limit_to_groups(scores, num_groups=4, num_limited=2, score_func="softmax")
    assert torch.isfinite(kept).tolist() == [[True, True, False, False, True, True, False,
                                               False]]


def test_router_bias_steers_choice_not_weights():
    args = MoEArgs(num_experts=4, top_k=1, score_func="sigmoid", route_norm=False,
                   route_scale=2.0)
    router = TokenChoiceTopKRouter(3, args)
    with torch.no_grad():
        router.gate.weight.copy_(torch.eye(4, 3))
    x = torch.tensor([[2.0, 1.0, 0.0]])  # logits 2, 1, 0, 0
    weights, selected, _ = router(x)
    assert selected.tolist() == [[0]]
    torch.testing.assert_close(weights, 2.0 * torch.sigmoid(torch.tensor([[2.0]])))
    bias = torch.tensor([0.0, 0.5, 0.0, 0.0])  # sigmoid(1) + 0.5 > sigmoid(2)
    weights, selected, _ = router(x, bias)
    assert selected.tolist() == [[1]]
    torch.testing.assert_close(weights, 2.0 * torch.sigmoid(torch.tensor([[1.0]])))


def test_router_gates_in_fp32_for_bf16_inputs():
    router = TokenChoiceTopKRouter(8, MoEArgs(num_experts=4)).to(torch.bfloat16)
    weights, _, scores = router(torch.randn(5, 8, dtype=torch.bfloat16))
    assert weights.dtype == scores.dtype == torch.float32


def test_bias_update_rule_hand_case():
    counts = torch.tensor([6.0, 2.0, 4.0, 0.0])  # mean 3
    assert bias_update(counts, 0.1).tolist() == pytest.approx([-0.1, 0.1, -0.1, 0.1])
    assert bias_update(torch.tensor([2.0, 2.0]), 0.1).tolist() == [0.0, 0.0]


def _moe(**overrides) -> MoE:
    torch.manual_seed(0)
    args = MoEArgs(**{"num_experts": 4, "top_k": 2, "num_shared_experts": 1, **overrides})
    moe = MoE(8, 8, args)
    moe.init_weights(0.02)
    return moe


def test_moe_layer_equals_dense_reference():
    moe = _moe(route_scale=1.5)
    x = torch.randn(2, 5, 8)
    weights, selected, _ = moe.router(x.view(-1, 8), moe.expert_bias)
    expected = moe.shared_experts(x.view(-1, 8))
    for t in range(10):
        for j in range(2):
            e = selected[t, j]
            n = torch.tensor([1 if i == e else 0 for i in range(4)])
            expected[t] += weights[t, j] * moe.experts(x.view(-1, 8)[t : t + 1], n)[0]
    torch.testing.assert_close(moe(x), expected.view(2, 5, 8), atol=1e-6, rtol=1e-5)


def test_expert_without_tokens_trains():
    moe = _moe(num_experts=4, top_k=1)
    with torch.no_grad():
        moe.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, -10.0]))  # expert 3 never chosen
    x = torch.randn(2, 6, 8)
    moe(x).square().sum().backward()
    assert moe.tokens_per_expert[3] == 0
    assert moe.experts.w1.grad[3].abs().sum() == 0
    assert moe.experts.w1.grad[:3].abs().sum() > 0


def test_tokens_counted_once_under_activation_checkpointing():
    moe = _moe(top_k=2)
    x = torch.randn(2, 3, 8, requires_grad=True)
    checkpoint(moe, x, use_reentrant=False).sum().backward()
    assert moe.tokens_per_expert.sum() == 2 * 3 * 2  # tokens x top_k, not twice that


def test_sequence_balance_loss_hand_case():
    # one sequence of 2 tokens, 2 experts, top-1: token 0 -> expert 0, token 1 -> expert 0.
    args = MoEArgs(num_experts=2, top_k=1, num_shared_experts=0, aux_loss_coeff=0.5)
    scores = torch.tensor([[0.6, 0.2], [0.3, 0.1]])  # normalised: [.75, .25], [.75, .25]
    selected = torch.tensor([[0], [0]])
    # f = [2 * 2 / (1 * 2), 0] = [2, 0]; P = [.75, .25]; per sequence 0.5 * 1.5, times T = 2.
    assert sequence_balance_loss(scores, selected, 1, args).item() == pytest.approx(1.5)


def test_balance_experts_updates_bias_and_resets_counts():
    moe = _moe(load_balance_coeff=0.01)
    with torch.no_grad():
        moe.tokens_per_expert.copy_(torch.tensor([5.0, 1.0, 3.0, 3.0]))
    balance_experts(moe, reduce_mesh=None)
    assert moe.expert_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0])
    assert moe.tokens_per_expert.sum() == 0
    assert "expert_bias" in moe.state_dict() and "tokens_per_expert" not in moe.state_dict()


def test_bad_moe_args_refused():
    with pytest.raises(ValueError, match="num_expert_groups = 3 must divide"):
        MoEArgs(num_experts=8, num_expert_groups=3)
    with pytest.raises(ValueError, match="fewer than top_k"):
        MoEArgs(num_experts=8, top_k=4, num_expert_groups=4, num_limited_groups=1)
    with pytest.raises(ValueError, match="multiples of 8"):
        GroupedExperts(dim=16, hidden_dim=6, num_experts=2)


def test_aux_loss_reaches_the_gradient_through_step_hooks():
    """With hooks attached, the MoE's gradient is that of (output + aux_sum) / T."""
    moe = _moe(aux_loss_coeff=0.1, load_balance_coeff=None)
    x, tokens = torch.randn(2, 4, 8), torch.tensor(8.0)
    _, selected, scores = moe.router(x.view(-1, 8))
    aux = sequence_balance_loss(scores, selected, 2, moe.args)
    ((moe(x).sum() + aux) / tokens).backward()
    expected = moe.router.gate.weight.grad.clone()
    moe.zero_grad()
    hooks = StepHooks()
    attach_step_hooks(moe, hooks)
    hooks.begin_step(tokens)
    with hooks.recording():
        out = moe(x)
    (out.sum() / tokens).backward()
    hooks.end_step()
    torch.testing.assert_close(moe.router.gate.weight.grad, expected)
    assert not torch.equal(expected, _gate_grad_without_aux(x, tokens))


def _gate_grad_without_aux(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    moe = _moe(aux_loss_coeff=0.1, load_balance_coeff=None)
    (moe(x).sum() / tokens).backward()
    return moe.router.gate.weight.grad


def test_no_tokens_counted_outside_training_forwards():
    moe = _moe()
    with torch.no_grad():
        moe(torch.randn(1, 3, 8))
    moe.eval()
    moe(torch.randn(1, 3, 8))
    assert moe.tokens_per_expert.sum() == 0
