"""bf16 Adam moments (components/bf16_moments.py): one step exactly as computed by hand, 50 steps
within the module's derived bound of fp32 moments (``moment_deviation_bound``: its docstring
holds the derivation) for the chunked foreach step and for the compiled fused step, the two
within twice that bound of each other (each within it of the same fp32 run), exact resumption
through DCP, halved state bytes, which fused path each torch takes, the start-up checks.
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

from torchtitan_like.components import bf16_moments
from torchtitan_like.components.bf16_moments import (
    Bf16MomentsAdam,
    CompiledBf16MomentsAdam,
    round_to_bf16,
)
from torchtitan_like.components.optimizer import build_optimizer
from torchtitan_like.config.derived import optimizer_state_dtype
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.optimization import Optimizer
from torchtitan_like.validate import parse_args

LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1


@pytest.fixture(autouse=True, scope="module")
def own_inductor_cache(tmp_path_factory):
    """The compiled step's kernels in a cache of this run's own: torch 2.13's inductor reloads a
    CPU kernel cached under another ATEN_CPU_CAPABILITY (AVX-512 here, then avx2) and computes
    wrong updates with it (seen: |p - p_fp32| 0.07 against 5e-4), so a cache shared between
    the default and the avx2 run of this file would fail the bounds for the cache's sake."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


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
    return bf16_moments.moment_deviation_bound(grads, p0, LR, BETAS, EPS)


def compiled_adamw(params) -> CompiledBf16MomentsAdam:
    return CompiledBf16MomentsAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                   decoupled_weight_decay=True)


def run_fifty_steps(make) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """50 steps of ``make([param])`` and of fp32 AdamW on one gradient sequence: the two final
    parameters and the derived bound."""
    grads = gradients(50, (128, 64))
    p0 = torch.randn(128, 64, generator=torch.Generator().manual_seed(7)) * 0.02
    ours, fp32 = nn.Parameter(p0.clone()), nn.Parameter(p0.clone())
    opts = [make([ours]), torch.optim.AdamW([fp32], lr=LR, betas=BETAS, eps=EPS,
                                            weight_decay=WD, foreach=True)]
    for g in grads:
        ours.grad, fp32.grad = g.clone(), g.clone()
        for opt in opts:
            opt.step()
    return ours.detach(), fp32.detach(), moment_deviation_bound(grads, p0)


@pytest.mark.parametrize("make", [bf16_adamw, compiled_adamw], ids=["foreach", "compiled"])
def test_fifty_steps_stay_within_the_derived_bound_of_fp32_moments(make):
    ours, fp32, bound = run_fifty_steps(make)
    deviation = (ours - fp32).abs().double()
    margin = (deviation / bound).max().item()
    print(f"50 steps: largest |p_bf16 - p_fp32| {deviation.max():.3g}, margin {margin:.3g}")
    assert margin <= 1
    assert deviation.max() > 0, "bf16 rounding of the moments must show"


def test_compiled_and_foreach_steps_agree_within_twice_the_bound():
    """Each is within the bound of the same fp32 run, so within twice it of the other."""
    compiled, _, bound = run_fifty_steps(compiled_adamw)
    foreach, _, _ = run_fifty_steps(bf16_adamw)
    margin = ((compiled - foreach).abs().double() / (2 * bound)).max().item()
    print(f"compiled vs foreach: margin {margin:.3g} of twice the bound")
    assert margin <= 1


def test_compiled_adam_with_l2_weight_decay_takes_the_same_step():
    """Adam (weight decay added to the gradient): one step from the same bf16 moments as the
    foreach step, within the bound of one step (a few fp32 ulps, then bf16 rounding)."""
    torch.manual_seed(0)
    p0 = torch.randn(64, 32)
    params = [nn.Parameter(p0.clone()) for _ in range(2)]
    grads = [torch.randn(64, 32) * 1e-2]
    kw = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD,
          "decoupled_weight_decay": False}
    opts = [Bf16MomentsAdam([params[0]], **kw, foreach=True),
            CompiledBf16MomentsAdam([params[1]], **kw)]
    for p, opt in zip(params, opts, strict=True):
        p.grad = grads[0].clone()
        opt.step()
    bound = moment_deviation_bound([grads[0] + WD * p0], p0)
    assert ((params[0] - params[1]).abs().double() <= 2 * bound).all()
    assert opts[1].state[params[1]]["exp_avg"].dtype == torch.bfloat16


def train(opt: torch.optim.Optimizer, p: nn.Parameter, grads: list[torch.Tensor]) -> None:
    for g in grads:
        p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("make", [bf16_adamw, compiled_adamw], ids=["foreach", "compiled"])
def test_checkpoints_hold_bf16_moments_and_resume_bitwise(tmp_path, make):
    """DCP save -> a fresh optimizer loads (torch casts the moments to fp32; the post-hook
    casts them back) -> the continued run equals the uninterrupted one bitwise."""
    grads = gradients(6, (32, 16), seed=1)
    whole = nn.Linear(16, 32, bias=False)
    first = nn.Linear(16, 32, bias=False)
    first.load_state_dict(whole.state_dict())
    reference = make(whole.parameters())
    train(reference, whole.weight, grads)

    opt = make(first.parameters())
    train(opt, first.weight, grads[:3])
    dcp.save({"model": first.state_dict(), "optim": get_optimizer_state_dict(first, opt)},
             checkpoint_id=tmp_path)
    saved = dcp.FileSystemReader(tmp_path).read_metadata().state_dict_metadata
    assert saved["optim.state.weight.exp_avg"].properties.dtype == torch.bfloat16

    resumed = nn.Linear(16, 32, bias=False)
    opt2 = make(resumed.parameters())
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
    (["--optimizer.implementation", "fused", "--optimizer.state_dtype", "bfloat16",
      "--optimizer.state_stochastic_rounding", "true"], "fused bf16-moment steps round to"),
])
def test_refused_at_start_up(flags, message):
    """(Stochastic rounding without bf16 moments is a setting without effect, named at
    start-up: tests/unit/test_switches.py.)"""
    with pytest.raises(ConfigError, match=message):
        parse_args(flags, world_size=1)


def test_torchtitans_name_turns_on_bf16_moments():
    config = Optimizer(implementation="fused_opt_states_bf16")
    from torchtitan_like.components.optimizer import validate

    validate(config, "float32", "cuda")
    assert optimizer_state_dtype(config) == "bfloat16"
    assert config.state_dtype == "float32"  # derived, not written into the config


def test_each_torch_and_device_takes_its_fused_path():
    """torch's own fused kernel where it takes bf16 states (CUDA, torch >= 2.13: module
    docstring), the compiled step everywhere else (torch 2.11 refused them on an H200)."""
    assert bf16_moments.fused_path("cuda", (2, 13)) == "torch"
    assert bf16_moments.fused_path("cuda", (2, 14)) == "torch"
    assert bf16_moments.fused_path("cuda", (2, 11)) == "compiled"
    assert bf16_moments.fused_path("cuda", (2, 12)) == "compiled"
    assert bf16_moments.fused_path("cpu", (2, 13)) == "compiled"
    p = nn.Parameter(torch.zeros(4))
    for name in ("fused", "fused_opt_states_bf16"):
        config = Optimizer(implementation=name, state_dtype="bfloat16")
        assert isinstance(build_optimizer([p], config), CompiledBf16MomentsAdam)


def test_torchs_own_fused_kernel_refuses_bf16_states_on_cpu():
    """Why the CPU takes the compiled step: torch's CPU fused Adam has no mixed path."""
    p = nn.Parameter(torch.zeros(4))
    p.grad = torch.ones(4)
    opt = bf16_moments.fused_with_bf16_moments(torch.optim.AdamW([p], fused=True))
    with pytest.raises(RuntimeError, match="BFloat16"):
        opt.step()


def test_a_fused_step_that_cannot_compile_is_refused_in_one_line(monkeypatch):
    assert "C++ compiler" in bf16_moments.compiled_unsupported_reason("cpu", False, False)
    assert "Triton" in bf16_moments.compiled_unsupported_reason("cuda", False, True)
    assert bf16_moments.compiled_unsupported_reason("cuda", True, False) is None
    monkeypatch.setattr(bf16_moments.shutil, "which", lambda _name: None)
    with pytest.raises(ConfigError, match=r'implementation = "fused" with bf16 moments: '
                                          r"torch.compile's CPU backend needs a C"):
        parse_args(["--optimizer.implementation", "fused", "--optimizer.state_dtype",
                    "bfloat16"], world_size=1)
