"""Benchmarks: each module times one part of the platform next to its ceiling, measured in the
same run (`python -m experiments.benchmarks.<name> --help` for its flags). Figures and commands:
docs/benchmarks.md."""
