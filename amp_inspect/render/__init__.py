"""Reading a run for a person: the per-step series of a run log (series.py, no rendering), matplotlib figures
(plots.py), the self-contained HTML report, and the rich or plain console tables. Torch-free: ``amp-inspect
summary`` and ``report`` run without torch.
"""
