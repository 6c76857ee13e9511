"""The model as the inspector sees it: one view built at attach (root, the unwrapped model behind torch.compile,
DDP, FSDP and peft, clean module names, parameter entries, GEMM modules, device and dtype) and refreshed only when
its fingerprint says the model changed; the names of parameters (naming.py), the wrappers looked through or
refused (wrappers.py), and what the first forward and backward show (autocast dtype, backward order).
"""
