"""The policy model on disk and behind vLLM: preparing its weights (`models.py`) and starting
its server (`serve.py`). Imported by the command, the learner and the benchmarks; imports only
`shared`, never the worker or the learner."""
