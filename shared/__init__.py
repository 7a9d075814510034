"""Code that both the worker and the learner import. Imports nothing from `evoenv_*`."""
