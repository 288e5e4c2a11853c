"""Triton kernels with torch reference versions.  Kernels land with their own issue."""
