"""amp_inspect: a numerics inspector for PyTorch mixed-precision training.

One fused pass over all gradients counts NaN/Inf/zeros, what would overflow, turn subnormal or underflow
in fp16 / bf16 / fp8, extremes, sum of squares and an exponent histogram per tensor::

    stats = amp_inspect.tensor_stats(grads, formats=("fp16", "bf16"))
"""

from .formats import FORMATS
from .stats import TensorStats, tensor_stats

__all__ = ["FORMATS", "TensorStats", "tensor_stats"]
__version__ = "0.1.0"
