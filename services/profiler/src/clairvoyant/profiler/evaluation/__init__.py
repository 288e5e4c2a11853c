"""Offline evaluation of the profiler core on real and generated workflows.

data.py            workload programs (chatdev, claude_code, workload:<name>, synthetic:...) -> timed
                   records with block chains
synthetic.py       generated workflows with agents named per task (per_task_experts)
replay.py          prequential replay through WorkflowProfile and the metrics
cli.py             ``evaluate`` (one seed, or ``--seeds``) and ``convergence``: argparse entry point
                   (``main(argv)``), JSON report, rich progress
learning_bench.py  the cost of learning: annotate/ingest/re-learning on generated traffic
"""
