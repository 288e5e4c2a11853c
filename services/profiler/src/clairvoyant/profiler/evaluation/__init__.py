"""Offline evaluation of the profiler core on real and generated workflows.

data.py    workload programs (chatdev, claude_code, workload:<name>) -> timed records with block chains
replay.py  prequential replay through WorkflowProfile and the metrics
cli.py     ``evaluate``: argparse entry point (``main(argv)``), JSON report, rich progress
"""
