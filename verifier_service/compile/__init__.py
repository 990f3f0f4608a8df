"""Stages 1 and 2, on the source text: static checks, then the build of the candidate's extensions.

Nothing here executes candidate code: sources are read with `ast` (sources.py, checks.py) and
built exactly as `load_inline` would build them, only faster and cached (compiler.py, with
buildspec.py, header_tiers.py, tier_environment.py, pch.py, host_pch.py, nvcc_split.py,
objects.py, procs.py, cache.py; toolchain.py discovers nvcc, g++, torch and the GPUs).
"""
