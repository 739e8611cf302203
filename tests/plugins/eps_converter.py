"""A converter registered from outside the package (``[job] custom_import``): sets every
RMSNorm's epsilon to 1e-3, and counts its post-optimizer-step calls."""

from torch import nn

from torchtitan_like.components.converters import register_converter


class NormEpsConverter:
    def __init__(self):
        self.steps = 0

    def convert(self, model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                module.eps = 1e-3

    def post_optimizer_step(self, model: nn.Module) -> None:
        self.steps += 1


register_converter("norm_eps", lambda config, parallel_dims, device_type: NormEpsConverter())
