"""What a step's numbers show, decided from typed data and torch-free: where NaN/Inf started (attribution.py,
the one ranking every surface shows), gradient spikes (spikes.py), and how far the loss scale sits from a format's
edges (headroom.py). The step report carries these; the diagnosis and the renderers read them.
"""
