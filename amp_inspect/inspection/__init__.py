"""The user's door: ``attach()`` / ``Inspector`` (inspector.py) and its options written once (options.py),
what attach refuses, which steps are inspected, each report annotated by the probes and links, then into the
history, the run log and the listeners; ``summary()`` and ``doctor()`` of an inspector (run_advice.py).
"""
