"""Verdicts over a run: the history of steps and its summary (history.py: scale events, the collapse warning,
advice), the typed findings and their registry (findings.py), the checks of a setup and an environment, and
``doctor()`` (doctor.py). Reads every lower floor; rendered by render/, the CLI and the integrations.
"""
