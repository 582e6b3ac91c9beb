"""fractor's benchmarks: each workload against a hand-written raw anyio baseline.

Both sides run in the same process, interleaved, so a noisy machine moves them
together and the ratio stays meaningful. Run with ``make bench`` or
``python -m benchmarks [--backend trio] [--quick]``.
"""
