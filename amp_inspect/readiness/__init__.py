"""Format readiness of the GEMM operands (``readiness_every=N``): the hooks on each Linear / Conv1D that
measure X, W, dY and dW with ``format_readiness`` (hooks.py), the per-module ``ReadinessReport`` with its verdicts
(report.py, torch-free) and the module x recipe heatmap (plot.py).
"""
