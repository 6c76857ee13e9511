"""One step's gradients: the pass over them that ``check()`` and both scaler hooks run (gradient_pass.py), the
``StepReport`` it makes (step_report.py: per-module views, headroom, host values read lazily), and what the report
learns beside its gradients (step_context.py: autocast dtype, backward order, formats that follow them).
"""
