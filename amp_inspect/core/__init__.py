"""The numbers: the three ops (``tensor_stats``, ``format_readiness``, ``update_stats``) and everything they stand
on. The schema of statistics (statistics.py) and the format and recipe tables (formats.py, recipes.py), each
checked against the compiled library's at load time; ops.py, the only module that calls ``torch.ops.amp_inspect``
(kernel, else the pure-torch reference); the references in references/ (oracle and fallback); the user-facing
wrappers and their result types; small torch-free helpers every floor uses (printable names, plain tables). A
change to what is counted, or how, starts here and in csrc/. Imports nothing else of the package.
"""
