"""`longctx bench`: agentic trace replay against a deployment, measured the way the seed did.

The requests are sent by inference-perf (kubernetes-sigs, from PyPI) running in its own
environment (tools/bench-env.sh); this package writes its configuration and the trace,
renders the Job, and turns its per-request records into the report. Nothing here imports
the tool, matplotlib or vLLM: the operator process stays free of them.
"""
