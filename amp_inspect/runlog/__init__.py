"""The run log on disk: the JSONL file (one writer per file, a file is ours only by its first line), ``read_log``,
the histogram encodings of its records, and the hardware samples it carries. Torch-free: reading a run never
loads torch. What renders a log is in render/; what writes an inspector's steps into it is inspection's.
"""
