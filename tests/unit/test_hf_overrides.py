"""HuggingFace import and export of a model trained with [model] overrides: the flavor an HF
folder matches is compared with the overrides applied, and a checkpoint records its overrides
so that export rebuilds the trained shape (components/hf_checkpoint.py)."""

import pytest
import torch

from torchtitan_like.components.hf_checkpoint import (
    _matching_flavor,
    flavor_args,
    hf_to_seed_checkpoint,
    load_hf,
    model_from_checkpoint,
    model_from_hf,
    overrides_from_cli,
    save_hf,
)
from torchtitan_like.models.registry import get_model_spec

TWO_LAYERS = {"n_layers": "2"}  # as the command line gives it


@pytest.fixture
def hf_folder(tmp_path):
    """The tiny Llama with two layers instead of four, written as a HuggingFace folder."""
    spec = get_model_spec("llama3")
    args = flavor_args(spec, "tiny", TWO_LAYERS)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    model.init_weights()
    save_hf(model.state_dict(), spec.hf_adapter(args), tmp_path / "hf", torch.float32)
    return tmp_path / "hf", model.state_dict()


def test_the_matched_flavor_has_the_overrides_applied(hf_folder):
    folder, _ = hf_folder
    spec, (config, _) = get_model_spec("llama3"), load_hf(folder)
    with pytest.raises(ValueError, match="matches no llama3 flavor"):
        _matching_flavor(spec, config, folder)  # every flavor has 4 or more layers
    assert _matching_flavor(spec, config, folder, TWO_LAYERS) == "tiny"
    model, args = model_from_hf(spec, folder, overrides=TWO_LAYERS)
    assert args.n_layers == 2 and len(model.layers) == 2


def test_a_seed_checkpoint_records_its_overrides_for_export(hf_folder, tmp_path):
    folder, weights = hf_folder
    spec = get_model_spec("llama3")
    final, flavor = hf_to_seed_checkpoint(spec, folder, tmp_path / "ckpt", overrides=TWO_LAYERS)
    assert flavor == "tiny"
    model, args = model_from_checkpoint(spec, final)  # the overrides come from checkpoint.json
    assert args.n_layers == 2
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_override_flags_of_the_conversion_tools():
    assert overrides_from_cli(["moe.top_k = 2", "n_layers=8"]) == {"moe.top_k": "2",
                                                                  "n_layers": "8"}
    assert overrides_from_cli([]) is None
    with pytest.raises(ValueError, match="expected NAME=VALUE"):
        overrides_from_cli(["n_layers"])
