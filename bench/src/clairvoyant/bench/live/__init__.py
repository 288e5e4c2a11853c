"""``--mode live``: the workloads of ``--mode sim`` driven through a running stack's gateway.

    python -m clairvoyant.bench run --mode live --workload react_bfcl --policy fcfs-rr \\
        --gpus 2 --workflows 16 --concurrency 8 --base-url http://127.0.0.1:8000/v1 --out live.json

- ``driver``: the load driver (``openai`` SDK, one asyncio task per call, tool waits x ``--time-scale``);
- ``prompts``: prompt text with the simulator's token structure (exact lengths on emulated workers);
- ``cluster``: what the stack serves and runs, and the checks made before the first request;
- ``run``: one live experiment -> the metrics dict of ``--mode sim``;
- ``validate``: the ``sim-vs-live`` benchmark (a stack of emulated workers against the simulator);
- ``fleet``: emulated workers of several models behind our gateway, with a restartable scheduler;
- ``vllm_fleet``: workers fronting real vLLM servers for ``live-compare --engine vllm``, and vLLM's counters;
- ``routers``: sglang-router and vllm-router as child processes;
- ``compare``: the ``live-compare`` benchmark (our gateway under two presets against sglang-router,
  or against vllm-router on vLLM).

A live run measures the one preset the running scheduler uses; comparing presets live means one
stack (re)start per preset.  See docs/benchmarks.md, "Simulator against live".
"""
