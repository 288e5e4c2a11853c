"""Peer engines behind the worker contract: a worker that fronts a co-located vLLM or SGLang
server (``CV_ENGINE``).  ``adapter`` is one engine's API, ``frontend`` the worker's side of it,
``kv_bridge`` its KV events in our hashes, ``process`` its server process, ``app`` the wiring."""
