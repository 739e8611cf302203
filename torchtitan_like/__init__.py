"""torchtitan_like: a PyTorch-native, composable platform for pre-training LLMs."""
