"""Parallel layouts as trainer overrides, each spelled once (``--section.key=value``) for every
test file; a case is built by unpacking them: ``[*CP2, *TP2, *WHOLE]``."""

TP2 = ["--parallelism.tensor_parallel_degree=2"]
CP2 = ["--parallelism.context_parallel_degree=2"]
PP2 = ["--parallelism.pipeline_parallel_degree=2"]
HSDP = ["--parallelism.data_parallel_replicate_degree=2"]
"""Two replicas: with 4 processes, HSDP 2 x 2 (FSDP over the other 2)."""
EP2 = ["--parallelism.expert_parallel_degree=2"]
ETP2 = ["--parallelism.expert_tensor_parallel_degree=2"]
WHOLE = ["--training.local_batch_size=4"]
"""Each rank reads the whole global batch of 4 (one process, or ranks sharing one batch: TP,
CP, PP alone)."""
PP2_MICROBATCHES = [*PP2, *WHOLE, "--parallelism.pipeline_parallel_microbatch_size=1"]
"""PP=2 alone: one schedule step of 4 microbatches of 1 sequence."""
