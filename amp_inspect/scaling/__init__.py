"""The loss scale: ``InspectingGradScaler`` (GradScaler whose unscale pass is the inspection), the link that
watches a plain GradScaler (scaler_link.py), the ``ScalePolicy`` protocol and its policies (policies.py), the
scaler's decisions in words on a timeline (timeline.py, torch-free), and the watch on gradient clipping of
still-scaled gradients (clipping.py). Extension point: a policy registered with ``register_policy``.
"""
