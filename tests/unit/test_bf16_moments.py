"""bf16 Adam moments (components/bf16_moments.py): one step exactly as computed by hand, 50 steps
within a derived bound of fp32 moments, exact resumption through DCP, halved state bytes, the
start-up checks.

The 50-step bound. Both runs see the same gradient sequence (fixed, so no feedback through the
parameters). The bf16 run's step t uses m'_t = beta1 m~_{t-1} + (1 - beta1) g_t, where the stored
m~_{t-1} is m'_{t-1} rounded to bf16 (half an ulp: |rounding| <= 2^-8 |m'| relative to its
power of two, <= 2^-8 |m'|); so e_t = m'_t - m_t obeys |e_t| <= beta1 (|e_{t-1}| + 2^-8
|m'_{t-1}|), |m'| <= |m| + |e|, and the same for v with beta2. The update u = lr (m/c1) /
(sqrt(v/c2) + eps) then moves by at most lr/c1 (|e_m| / D' + |m| |D - D'| / (D D')), with
D = sqrt(v/c2) + eps and D' its value at the worst v' in v +- |e_v|. Summed over the steps (weight
decay multiplies earlier differences by 1 - lr wd < 1, and both runs round their fp32
arithmetic alike, a few ulps of p per step: 8 x 2^-24 |p| each) this bounds |p_bf16 - p_fp32|
per element; the test prints the margin.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from torchtitan_like.components.bf16_moments import Bf16MomentsAdam, round_to_bf16
from torchtitan_like.components.optimizer import build_optimizer
from torchtitan_like.config.derived import optimizer_state_dtype
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Optimizer
from torchtitan_like.validate import parse_args

LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1


def bf16_adamw(params, foreach: bool = True, stochastic: bool = False) -> Bf16MomentsAdam:
    return Bf16MomentsAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                           decoupled_weight_decay=True, foreach=foreach,
                           stochastic_rounding=stochastic)


def gradients(steps: int, shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * 10.0 ** torch.randint(-4, 1, shape, generator=g)
            for _ in range(steps)]


@pytest.mark.parametrize("foreach", [True, False])
def test_one_step_equals_the_hand_computed_update(foreach):
    """From stored bf16 moments: the fp32 AdamW step written out (torch's order of operations),
    the parameters bitwise; the stored moments are its fp32 moments rounded to bf16."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(64, 32))
    opt = bf16_adamw([p], foreach)
    m0, v0 = (torch.randn(64, 32) * 1e-2).bfloat16(), (torch.rand(64, 32) * 1e-4).bfloat16()
    opt.state[p].update(step=torch.tensor(3.0), exp_avg=m0.clone(), exp_avg_sq=v0.clone())
    p.grad = torch.randn(64, 32) * 1e-2
    expected_p = p.detach().clone()
    m, v, g, t = m0.float(), v0.float(), p.grad, 4
    expected_p.mul_(1 - LR * WD)
    m.lerp_(g, 1 - BETAS[0])
    v.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
    denom = (v.sqrt() / (1 - BETAS[1] ** t) ** 0.5).add_(EPS)
    expected_p.addcdiv_(m, denom, value=-LR / (1 - BETAS[0] ** t))
    opt.step()
    assert torch.equal(p.detach(), expected_p)
    assert torch.equal(opt.state[p]["exp_avg"], m.bfloat16())
    assert torch.equal(opt.state[p]["exp_avg_sq"], v.bfloat16())
    assert opt.state[p]["exp_avg"].dtype == torch.bfloat16 and opt.state[p]["step"] == t


def moment_deviation_bound(grads: list[torch.Tensor], p0: torch.Tensor) -> torch.Tensor:
    """The module docstring's per-element bound on |p_bf16 - p_fp32|, in fp64."""
    b1, b2 = BETAS
    m = v = e_m = e_v = torch.zeros_like(p0, dtype=torch.float64)
    bound = torch.zeros_like(m)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        e_m = b1 * (e_m + 2**-8 * (m.abs() + e_m))
        e_v = b2 * (e_v + 2**-8 * (v + e_v))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        c1, c2 = 1 - b1**t, 1 - b2**t
        d = (v / c2).sqrt() + EPS
        d_worst = ((v - e_v).clamp(min=0) / c2).sqrt() + EPS
        spread = ((v + e_v) / c2).sqrt() + EPS - d_worst
        bound += LR / c1 * (e_m / d_worst + m.abs() * spread / (d * d_worst))
        bound += 8 * 2.0**-24 * p0.abs().double()
    return bound


def test_fifty_steps_stay_within_the_derived_bound_of_fp32_moments():
    grads = gradients(50, (128, 64))
    p0 = torch.randn(128, 64) * 0.02
    ours, fp32 = nn.Parameter(p0.clone()), nn.Parameter(p0.clone())
    opts = [bf16_adamw([ours]), torch.optim.AdamW([fp32], lr=LR, betas=BETAS, eps=EPS,
                                                  weight_decay=WD, foreach=True)]
    for g in grads:
        ours.grad, fp32.grad = g.clone(), g.clone()
        for opt in opts:
            opt.step()
    deviation = (ours.detach() - fp32.detach()).abs().double()
    bound = moment_deviation_bound(grads, p0)
    margin = (deviation / bound).max().item()
    print(f"50 steps: largest |p_bf16 - p_fp32| {deviation.max():.3g}, margin {margin:.3g}")
    assert margin <= 1
    assert deviation.max() > 0, "bf16 rounding of the moments must show"


def train(opt: torch.optim.Optimizer, p: nn.Parameter, grads: list[torch.Tensor]) -> None:
    for g in grads:
        p.grad = g.clone()
        opt.step()


def test_checkpoints_hold_bf16_moments_and_resume_bitwise(tmp_path):
    """DCP save -> a fresh optimizer loads (torch casts the moments to fp32; the post-hook
    casts them back) -> the continued run equals the uninterrupted one bitwise."""
    grads = gradients(6, (32, 16), seed=1)
    whole = nn.Linear(16, 32, bias=False)
    first = nn.Linear(16, 32, bias=False)
    first.load_state_dict(whole.state_dict())
    reference = bf16_adamw(whole.parameters())
    train(reference, whole.weight, grads)

    opt = bf16_adamw(first.parameters())
    train(opt, first.weight, grads[:3])
    dcp.save({"model": first.state_dict(), "optim": get_optimizer_state_dict(first, opt)},
             checkpoint_id=tmp_path)
    saved = dcp.FileSystemReader(tmp_path).read_metadata().state_dict_metadata
    assert saved["optim.state.weight.exp_avg"].properties.dtype == torch.bfloat16

    resumed = nn.Linear(16, 32, bias=False)
    opt2 = bf16_adamw(resumed.parameters())
    state = {"model": resumed.state_dict(), "optim": get_optimizer_state_dict(resumed, opt2)}
    dcp.load(state, checkpoint_id=tmp_path)
    resumed.load_state_dict(state["model"])
    set_optimizer_state_dict(resumed, opt2, state["optim"])
    assert opt2.state[resumed.weight]["exp_avg"].dtype == torch.bfloat16
    train(opt2, resumed.weight, grads[3:])
    assert torch.equal(resumed.weight, whole.weight)
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt2.state[resumed.weight][name], reference.state[whole.weight][name])


def test_moment_state_bytes_are_halved():
    model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
    sizes = []
    for config in (Optimizer(), Optimizer(state_dtype="bfloat16")):
        opt = build_optimizer(list(model.parameters()), config)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        sizes.append(sum(s[k].nbytes for s in opt.state.values()
                         for k in ("exp_avg", "exp_avg_sq")))
    assert sizes[1] * 2 == sizes[0] == 8 * sum(p.numel() for p in model.parameters())


def test_stochastic_rounding_is_unbiased_where_nearest_is_not():
    """x = 1 + a quarter ulp of bf16 (ulp 2^-7 at 1): nearest always gives 1; stochastic
    rounding gives 1 + 2^-7 a quarter of the time, so the mean is x (4096 draws: a quarter
    +- 4 sigma, sigma = sqrt(p (1 - p) / n) = 0.0068)."""
    x = torch.full((4096,), 1 + 2**-9)
    assert torch.equal(round_to_bf16(x, stochastic=False).float(), torch.ones(4096))
    torch.manual_seed(0)
    rounded = round_to_bf16(x, stochastic=True).float()
    assert set(rounded.unique().tolist()) == {1.0, 1 + 2**-7}
    assert abs((rounded > 1).float().mean().item() - 0.25) < 4 * 0.0068


@pytest.mark.parametrize("flags, message", [
    (["--optimizer.state_dtype", "bfloat16", "--training.dtype", "bfloat16"],
     'set \\[training\\] dtype = "float32"'),
    (["--optimizer.implementation", "fused_opt_states_bf16"], "fused CUDA AdamW; this job runs"),
    (["--optimizer.state_stochastic_rounding", "true"], 'set state_dtype = "bfloat16" as well'),
])
def test_refused_at_start_up(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(flags, world_size=1)


def test_torchtitans_name_turns_on_bf16_moments():
    config = Optimizer(implementation="fused_opt_states_bf16")
    from torchtitan_like.components.optimizer import validate

    validate(config, "float32", "cuda")
    assert optimizer_state_dtype(config) == "bfloat16"
    assert config.state_dtype == "float32"  # derived, not written into the config
