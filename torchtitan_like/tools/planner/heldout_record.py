"""The held-out table of the published runs, as ttl-plan reads it (tools/planner/uncertainty.py):
per run, the held-out throughput ratio, the held-out reserved-memory ratio (None: not
published) and each step-time term's share of its step. Written by
``python scripts/plan_published.py --record``; tests/unit/test_planner_published.py checks
that it is current."""

HELD_OUT: dict[str, tuple[float, float | None, dict[str, float]]] = {
    '8B, 8 GPUs, FSDP': (0.974, 0.964, {
        'gemm': 0.35, 'attention': 0.13, 'memory_bound': 0.45, 'recompute': 0.04, 'fsdp': 0.01,
        'optimizer': 0.01}),
    '8B, 8 GPUs, FSDP + compile': (0.978, 1.035, {
        'gemm': 0.41, 'attention': 0.16, 'memory_bound': 0.36, 'recompute': 0.05, 'fsdp': 0.01,
        'optimizer': 0.02}),
    '8B, 8 GPUs, FSDP + compile + Float8': (0.981, 1.038, {
        'gemm': 0.28, 'attention': 0.2, 'memory_bound': 0.46, 'recompute': 0.03, 'fsdp': 0.02,
        'optimizer': 0.02}),
    '8B, 128 GPUs, FSDP': (1.027, 1.001, {
        'gemm': 0.35, 'attention': 0.13, 'memory_bound': 0.45, 'recompute': 0.04, 'fsdp':
        0.02}),
    '8B, 128 GPUs, FSDP + compile': (1.022, 1.087, {
        'gemm': 0.41, 'attention': 0.16, 'memory_bound': 0.36, 'recompute': 0.05, 'fsdp':
        0.03}),
    '8B, 128 GPUs, FSDP + compile + Float8': (0.997, 1.091, {
        'gemm': 0.28, 'attention': 0.2, 'memory_bound': 0.46, 'recompute': 0.03, 'fsdp': 0.04}),
    '8B, 8 GPUs, FSDP 8 x CP 1, seq 32,768': (1.074, 0.955, {
        'gemm': 0.14, 'attention': 0.39, 'memory_bound': 0.23, 'recompute': 0.23}),
    '8B, 8 GPUs, FSDP 4 x CP 2, seq 65,536': (0.835, 0.952, {
        'gemm': 0.07, 'attention': 0.55, 'memory_bound': 0.12, 'recompute': 0.22, 'cp': 0.03}),
    '8B, 8 GPUs, FSDP 2 x CP 4, seq 131,072': (1.051, 0.954, {
        'gemm': 0.04, 'attention': 0.65, 'memory_bound': 0.06, 'recompute': 0.22, 'cp': 0.04}),
    '8B, 8 GPUs, FSDP 1 x CP 8, seq 262,144': (1.049, 0.948, {
        'gemm': 0.02, 'attention': 0.7, 'memory_bound': 0.03, 'recompute': 0.21, 'cp': 0.04}),
    '70B, 256 GPUs, FSDP 32 x TP 8': (1.044, 0.936, {
        'gemm': 0.25, 'attention': 0.1, 'memory_bound': 0.24, 'recompute': 0.19, 'tp': 0.21}),
    '70B, 256 GPUs, FSDP 32 x TP 8, async TP': (0.988, 0.999, {
        'gemm': 0.25, 'attention': 0.1, 'memory_bound': 0.24, 'recompute': 0.19, 'tp': 0.21}),
    '405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, 1F1B': (1.029, 0.937, {
        'gemm': 0.17, 'attention': 0.04, 'memory_bound': 0.09, 'recompute': 0.1, 'tp': 0.08,
        'fsdp': 0.09, 'bubble': 0.42, 'grad_accumulation': 0.01}),
    '405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, interleaved 1F1B': (1.163, 1.029, {
        'gemm': 0.25, 'attention': 0.06, 'memory_bound': 0.13, 'recompute': 0.14, 'tp': 0.12,
        'fsdp': 0.13, 'bubble': 0.16, 'grad_accumulation': 0.02}),
    '405B, 512 GPUs, TP 8 x PP 8 x FSDP 8 x CP 1, seq 32,768': (1.058, 1.032, {
        'gemm': 0.14, 'attention': 0.12, 'memory_bound': 0.07, 'recompute': 0.1, 'tp': 0.06,
        'fsdp': 0.07, 'bubble': 0.43}),
    '405B, 512 GPUs, TP 8 x PP 8 x FSDP 4 x CP 2, seq 65,536': (1.082, 1.056, {
        'gemm': 0.09, 'attention': 0.21, 'memory_bound': 0.04, 'recompute': 0.1, 'tp': 0.04,
        'cp': 0.03, 'fsdp': 0.04, 'bubble': 0.45}),
    '405B, 512 GPUs, TP 8 x PP 8 x FSDP 2 x CP 4, seq 131,072': (0.973, 1.047, {
        'gemm': 0.05, 'attention': 0.28, 'memory_bound': 0.03, 'recompute': 0.11, 'tp': 0.02,
        'cp': 0.03, 'fsdp': 0.03, 'bubble': 0.45}),
    '405B, 512 GPUs, TP 8 x PP 8 x FSDP 1 x CP 8, seq 262,144': (1.015, 0.96, {
        'gemm': 0.03, 'attention': 0.32, 'memory_bound': 0.01, 'recompute': 0.1, 'tp': 0.01,
        'cp': 0.05, 'fsdp': 0.01, 'bubble': 0.46}),
    'Llama 3 405B, 8,192 GPUs, TP 8 x PP 16 x DP 64': (1.014, None, {
        'gemm': 0.51, 'attention': 0.06, 'memory_bound': 0.1, 'tp': 0.09, 'fsdp': 0.02, 'pp':
        0.01, 'bubble': 0.18, 'grad_accumulation': 0.02}),
    'Llama 3 405B, 16,384 GPUs, TP 8 x PP 16 x DP 128': (0.88, None, {
        'gemm': 0.43, 'attention': 0.05, 'memory_bound': 0.08, 'tp': 0.08, 'fsdp': 0.04, 'pp':
        0.01, 'bubble': 0.31, 'grad_accumulation': 0.02}),
    'Llama 3 405B, 16,384 GPUs, TP 8 x CP 16 x PP 16 x DP 8, seq 131,072': (0.953, None, {
        'gemm': 0.2, 'attention': 0.35, 'memory_bound': 0.04, 'tp': 0.04, 'cp': 0.04, 'fsdp':
        0.02, 'bubble': 0.31, 'grad_accumulation': 0.01}),
    'DeepSeek-V3 671B, 2,048 H800, PP 16 x EP 64, no TP': (1.008, None, {
        'gemm': 0.23, 'attention': 0.17, 'memory_bound': 0.43, 'recompute': 0.04, 'fsdp': 0.01,
        'pp': 0.03, 'bubble': 0.06, 'grad_accumulation': 0.03}),
}
