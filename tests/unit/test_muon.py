"""Muon (components/optim/muon.py) on one device against torch's own optimizers, its parameter
groups, its checkpoints and its start-up checks.

Exactness. The matrices' step calls torch.optim.Muon's functions (the Newton-Schulz iteration
in bf16, the update-scale rule) on the same momentum, in the same order of operations, so a
step equals ``torch.optim.Muon``'s bitwise; the other parameters are stepped by torch's AdamW
itself, so they equal it bitwise too. A routed-expert stack [E, m, n] equals E separate
``torch.optim.Muon`` matrices (which refuses 3-D parameters), each scaled by its own m x n.
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

from torchtitan_like.components.lr_scheduler import LRSchedulersContainer
from torchtitan_like.components.optim.newton_schulz import Iteration, newton_schulz
from torchtitan_like.components.optim.param_groups import parameter_kinds
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.validate import parse_args

MUON = ["--optimizer.name=Muon", "--optimizer.lr=2e-3", "--muon.lr=3e-2",
        "--muon.weight_decay=0.05", "--optimizer.weight_decay=0.1"]


class Tiny(nn.Module):
    """Embedding, one block group of two blocks (a matrix, a bias, a norm gain, a 3-D expert
    stack), a final norm and a head: every kind of parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(50, 16)
        self.layers = nn.ModuleDict({str(i): nn.ModuleDict({
            "attention": nn.Linear(16, 24, bias=True), "norm": nn.RMSNorm(16)})
            for i in range(2)})
        self.layers["1"].register_parameter("experts", nn.Parameter(torch.randn(3, 8, 16)))
        self.norm = nn.RMSNorm(16)
        self.output = nn.Linear(16, 50, bias=False)


def make(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def gradients(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-2


def container(model: nn.Module, argv: list[str]) -> OptimizersContainer:
    return OptimizersContainer([model], build_job_config(argv))


def test_parameter_groups_follow_the_rule():
    model = make()
    by_id = {id(p): kind for kind, params in parameter_kinds(model).items() for p in params}
    kinds = {name: by_id[id(p)] for name, p in model.named_parameters()}
    assert kinds == {
        "tok_embeddings.weight": "other", "output.weight": "other", "norm.weight": "no_decay",
        **{f"layers.{i}.attention.weight": "matrix" for i in range(2)},
        **{f"layers.{i}.attention.bias": "no_decay" for i in range(2)},
        **{f"layers.{i}.norm.weight": "no_decay" for i in range(2)},
        "layers.1.experts": "matrix"}


def test_a_weight_shared_with_the_blocks_is_not_a_matrix():
    """An embedding a block reuses (DeepSeek-V3's multi-token prediction) stays AdamW's."""
    model = make()
    model.layers["0"]["embed"] = model.tok_embeddings
    kinds = parameter_kinds(model)
    assert any(p is model.tok_embeddings.weight for p in kinds["other"])
    assert not any(p is model.tok_embeddings.weight for p in kinds["matrix"])


@pytest.mark.parametrize("rule", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_three_steps_equal_torch_muon_and_torch_adamw(rule, nesterov):
    """Every parameter bitwise equal to torch.optim.Muon (matrices, each expert apart) and
    torch.optim.AdamW (embedding and head with weight decay, norms and biases without), over
    three steps (the momentum carried)."""
    ours, theirs = make(), make()
    argv = [*MUON, f"--muon.adjust_lr_fn={rule}", f"--muon.nesterov={str(nesterov).lower()}"]
    optimizer = container(ours, argv)
    layers = theirs.layers
    matrices = [layers["0"]["attention"].weight, layers["1"]["attention"].weight]
    experts = [nn.Parameter(layers["1"].experts.detach()[e].clone()) for e in range(3)]
    muon = torch.optim.Muon([*matrices, *experts], lr=3e-2, weight_decay=0.05, momentum=0.95,
                            nesterov=nesterov, adjust_lr_fn=rule)
    decayed = [theirs.tok_embeddings.weight, theirs.output.weight]
    not_decayed = [p for n, p in theirs.named_parameters() if p.ndim == 1]
    adamw = torch.optim.AdamW([{"params": decayed}, {"params": not_decayed, "weight_decay": 0.0}],
                              lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                              foreach=True)
    for step in range(3):
        gradients(ours, step)
        gradients(theirs, step)
        for e, expert in enumerate(experts):
            expert.grad = layers["1"].experts.grad[e].clone()
        optimizer.step()
        muon.step()
        adamw.step()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        if name != "layers.1.experts":
            assert torch.equal(p, q), name
    assert torch.equal(ours.layers["1"].experts, torch.stack([e.detach() for e in experts]))
    (mine,) = optimizer.optimizers
    assert mine.orthogonalized == 3 * 5  # 2 matrices + 3 experts per step, on this one rank


def test_float32_iteration_is_torchs_in_float32():
    """``ns_dtype = float32`` runs torch's iteration with its bf16 cast intercepted: fp32 out,
    the input left alone, and within bf16's distance of the bf16 iteration."""
    torch.manual_seed(0)
    x = torch.randn(24, 16)
    kept = x.clone()
    fp32 = newton_schulz(x, Iteration(dtype=torch.float32))
    bf16 = newton_schulz(x.bfloat16(), Iteration())
    assert fp32.dtype == torch.float32 and torch.equal(x, kept)
    assert not torch.equal(fp32, bf16.float())
    # 5 iterations of bf16 products: a few bf16 steps (2^-8 relative) of entries <= ~1.2
    assert (fp32 - bf16.float()).abs().max() < 5 * 2**-8 * 1.2


def test_bf16_moments_keep_the_adamw_side_in_bf16_and_resume_bitwise(tmp_path):
    """bf16 moments on the AdamW side (Muon's momentum stays fp32); DCP save, a fresh
    optimizer loads (both sides' states, the AdamW side relinked to the loaded groups and its
    own load hooks run) and the continued run equals the uninterrupted one bitwise. (The
    fused implementations keep the same hooks, components/bf16_moments.py; their compile
    would cost this file 30 s.)"""
    argv = [*MUON, "--optimizer.state_dtype=bfloat16"]
    whole, first, resumed = make(), make(), make()
    reference = container(whole, argv)
    for step in range(4):
        gradients(whole, step)
        reference.step()
    (opt,) = container(first, argv).optimizers
    for step in range(2):
        gradients(first, step)
        opt.step()
    dcp.save({"model": first.state_dict(), "optim": get_optimizer_state_dict(first, opt)},
             checkpoint_id=tmp_path / "checkpoint")
    saved = dcp.FileSystemReader(tmp_path / "checkpoint").read_metadata().state_dict_metadata
    assert saved["optim.state.output.weight.exp_avg"].properties.dtype == torch.bfloat16
    assert saved["optim.state.layers.0.attention.weight.momentum_buffer"].properties.dtype \
        == torch.float32
    (opt2,) = container(resumed, argv).optimizers
    state = {"model": resumed.state_dict(), "optim": get_optimizer_state_dict(resumed, opt2)}
    dcp.load(state, checkpoint_id=tmp_path / "checkpoint")
    resumed.load_state_dict(state["model"])
    set_optimizer_state_dict(resumed, opt2, state["optim"])
    assert opt2.adamw.state is opt2.state
    assert opt2.adamw.param_groups == [g for g in opt2.param_groups if not g["muon"]]
    assert opt2.state[resumed.output.weight]["exp_avg"].dtype == torch.bfloat16
    for step in range(2, 4):
        gradients(resumed, step)
        opt2.step()
    for (name, p), q in zip(resumed.named_parameters(), whole.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_the_schedule_scales_both_learning_rates():
    config = build_job_config([*MUON, "--lr_scheduler.warmup_steps=3"])
    optimizers = OptimizersContainer([make()], config)
    schedulers = LRSchedulersContainer(optimizers, config.lr_scheduler, steps=10)
    optimizers.step()
    schedulers.step()
    lrs = {g["muon"]: g["lr"] for g in optimizers.optimizers[0].param_groups}
    assert lrs == pytest.approx({True: 3e-2 * 0.5, False: 2e-3 * 0.5})


def test_muon_lr_zero_takes_the_adamw_lr():
    (opt,) = container(make(), ["--optimizer.name=Muon", "--optimizer.lr=1e-3"]).optimizers
    assert {g["lr"] for g in opt.param_groups} == {1e-3}


@pytest.mark.parametrize(("argv", "message"), [
    (["--optimizer.name=muon"], r"unknown optimizer 'muon'; registered: AdamW, Adam, Muon.*"
                                r"did you mean 'Muon'\?"),
    (["--optimizer.name=Muon", "--muon.ns_steps=0"], r"\[muon\] ns_steps"),
    (["--optimizer.name=Muon", "--muon.adjust_lr_fn=rms"], r"\[muon\] adjust_lr_fn"),
])
def test_refused_at_start_up(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(argv, world_size=1)


LARGEST_SLOPE = 3.4445**5
"""The Newton-Schulz map's largest slope: p'(0)^5 for p(x) = a x + b x^3 + c x^5 iterated 5
times (on [0, 1.2], where the singular values of the normalised input and its iterates lie,
|p'| peaks at 0: computed on a grid, 484.9 = a^5)."""


def test_orthogonalization_of_the_tiny_llamas_gradients_stays_within_its_largest_slope():
    """kappa = (|dO| / |O|) / (|dM| / |M|): how much the fp32 iteration amplifies a relative
    perturbation of its input of the size the layouts' reordered sums make (2e-6 relative per
    element), on the tiny Llama's own first-step gradients of every block matrix (the first
    momentum, up to a factor). A perturbation is amplified at most by the map's largest
    slope (LARGEST_SLOPE, reached by singular values near 0, which these low-rank gradients
    have: kappa measured 26 here, 1.6-2.8 on Gaussian matrices); the parity bound MUON_TOL
    (tests/e2e/test_resume.py) is derived for that worst case."""
    from torchtitan_like.models.llama3.args import llama3_flavors
    from torchtitan_like.models.llama3.model import Transformer

    torch.manual_seed(0)
    model = Transformer(llama3_flavors["tiny"])
    model.init_weights()
    tokens = torch.randint(0, 256, (4, 64))
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    it = Iteration(dtype=torch.float32)
    worst = 0.0
    for p in parameter_kinds(model)["matrix"]:
        m = p.grad
        noise = torch.randn(m.shape, generator=torch.Generator().manual_seed(1)) * m.abs() * 2e-6
        o, perturbed = newton_schulz(m.clone(), it), newton_schulz((m + noise).clone(), it)
        worst = max(worst, ((perturbed - o).norm() / o.norm() / (noise.norm() / m.norm())).item())
    print(f"largest kappa over the tiny Llama's 28 matrices: {worst:.2f}")
    assert 1 < worst < LARGEST_SLOPE
