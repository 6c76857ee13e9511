"""The commands: ``amp-inspect`` (main.py: summary, report, doctor, updates, readiness, info, demo), the demo and
its tiny GPT, the pure-Python checks it and the benchmarks compare against (baselines.py), and ``info``.
"""
