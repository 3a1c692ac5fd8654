"""Triton kernels, one module per op: kernels at the top, launchers and backends below."""
