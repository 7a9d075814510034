"""EvoEnv workers: the Celery app and tasks, the sandbox, validation, grading and the CLI."""

__version__ = "0.1.0"
