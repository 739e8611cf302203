"""The package's contracts: what a model, its HuggingFace adapter and the trainer agree on.

This layer sits just above ``config/`` and below ``distributed/``, ``models/`` and
``components/`` (docs/design.md, "Layers"); it imports nothing of the package but ``config/``.
``loss.py``: the summed cross-entropy a step's loss is made of and the label that is not
trained on; ``step_hooks.py``: the loss terms and metrics a model module reports for a step;
``model_args.py``: ``BaseModelArgs``, a model family's hyper-parameters; ``hf_adapter.py``:
``HFAdapter``, the mapping to and from HuggingFace; ``model_spec.py``: ``ModelSpec``, everything
model-specific the trainer needs (models/registry.py registers and finds them).
"""
