"""A deterministic discrete-event simulator that runs the live decision code in virtual time.

The replicas are real ``LLMEngine`` instances over an emulated runner whose steps take the time a
cost model predicts; placement is the scheduler service's own ``GlobalScheduler`` with any
registered preset.  Nothing here re-implements a policy.
"""
