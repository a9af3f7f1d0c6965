"""corral's benchmarks: `uv run --all-extras python -m bench` (or `bash bench/run.sh`).

They report, they do not assert: each case prints corral's median and p95 beside a
baseline's, the ratio, and whether the issue's target was met. Not collected by pytest.
"""
