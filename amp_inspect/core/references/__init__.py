"""Pure-torch references of the three ops, each written from the schema's and the recipe table's rules alone
(not from the kernels): the tests' oracles, the fallback where no kernel serves, the benchmarks' baseline.
"""
