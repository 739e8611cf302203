"""Optimizers: the registry (registry.py), parameter groups by rule (param_groups.py), Muon
(muon.py) and its distributed Newton-Schulz iteration (newton_schulz.py). The built-in
optimizers are registered by components/optimizer.py."""
