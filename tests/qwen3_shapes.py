"""The transformers config of a Qwen3 flavor's shape, written from our hyper-parameters
(shared by the Qwen3 tests; no download)."""

from torchtitan_like.models.qwen3 import Qwen3Args


def hf_config(args: Qwen3Args):
    """The transformers config of this shape (transformers imported here: it is an extra)."""
    import transformers

    common = dict(vocab_size=args.vocab_size, hidden_size=args.dim,
                  num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
                  num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                  intermediate_size=args.hidden_dim, rms_norm_eps=args.norm_eps,
                  rope_theta=args.rope_theta, tie_word_embeddings=args.tie_word_embeddings)
    if args.moe is None:
        return transformers.Qwen3Config(**common)
    return transformers.Qwen3MoeConfig(
        **common, num_experts=args.moe.num_experts, num_experts_per_tok=args.moe.top_k,
        moe_intermediate_size=args.moe_hidden_dim, norm_topk_prob=args.moe.route_norm)
