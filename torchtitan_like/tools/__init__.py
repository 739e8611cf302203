"""Tools around the trainer: the parallelism planner, the ablation runner, memory measurement."""
