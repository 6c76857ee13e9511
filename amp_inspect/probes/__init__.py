"""Hooks that watch the training while it runs and add to a step's report: the ``Probe`` protocol the inspector
drives in one loop (probe.py), the activation hooks that find the first module whose output went non-finite and
when they are armed, and torch.compile's force_eager stance they (and the readiness hooks) share.
"""
