"""What each optimizer step did (``optimizer=``, ``update_every=N``): the step hooks that snapshot the
parameters and run ``update_stats`` (watch.py), the per-module ``UpdateStats`` with its verdicts (report.py,
torch-free) and the update-ratio figure (plot.py).
"""
