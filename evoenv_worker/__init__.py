"""EvoEnv workers: the Celery app and tasks, the sandbox, validation, admission and grading."""

__version__ = "0.1.0"
