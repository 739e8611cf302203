"""The torch dtype each ``DTypeName`` of the config (config/job_config.py) stands for."""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
