"""KernelBench-style evaluation: metrics, resumable verdict store, reports, plots, run comparison."""
