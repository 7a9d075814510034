"""EvoEnv's exceptions, drawn once in `EvoEnvError`'s docstring. Exceptions are for
infrastructure; a broken environment is a result, not an exception (docs/DESIGN.md#failure-rules).
"""

from __future__ import annotations


class EvoEnvError(Exception):
    """Base class of every error EvoEnv raises on purpose.

        EvoEnvError
        ├── SandboxUnavailable   the sandbox cannot start here (a missing tool, a kernel too old)
        ├── SandboxFailure       the running sandbox broke down (not the environment's fault)
        ├── ServiceUnavailable   Redis, the database or a model server cannot be reached
        ├── PoolEmpty            the pool has nothing to sample (the seeds were never recorded?)
        ├── DiskFull             a checkpoint or a weight push does not fit on the disk
        ├── UsageError           bad input from a person: one line that says what to fix
        │   └── SchemaMismatch   stored data (the archive, a stream entry) of a schema version
        │                        this code does not read: which version, and what to do
        └── EnvironmentOutputError  what an environment returned cannot be used by a check

    A broken *environment* is never an exception past the check that found it: it is a result
    (a failed stage with a reason, or an `env_error` grade). `EnvironmentOutputError` travels
    only from where a check reads an environment's output to the stage that ran it, which
    rejects the file there. Exceptions are for infrastructure, and only they are retried.
    """


class SandboxUnavailable(EvoEnvError):
    """The sandbox cannot start on this machine; the message says what is missing."""


class SandboxFailure(EvoEnvError):
    """The sandbox process died or answered out of protocol for reasons not due to the code."""


class ServiceUnavailable(EvoEnvError):
    """A service EvoEnv depends on (Redis, the database, a model server) cannot be reached."""


class PoolEmpty(EvoEnvError):
    """The pool has no active member to sample (the seeds were never recorded?)."""


class DiskFull(EvoEnvError):
    """Not enough free disk space to write a checkpoint or pushed weights; the message says
    how much was needed, where, and what to free. What was written before stays intact."""


class UsageError(EvoEnvError):
    """A person's input is wrong; the message is one line that says what to fix."""


class SchemaMismatch(UsageError):
    """Data written by a schema version this code does not read (an archive, a stream entry,
    a message); the message names both versions and says what to do."""


class EnvironmentOutputError(EvoEnvError):
    """What an environment returned cannot be used by a check (wrong shape, past a bound).

    The environment's fault, never the project's: the stage that was running rejects the file
    with this message (and the instance's seed and difficulty, when known)."""

    def __init__(
        self, message: str, *, seed: int | None = None, difficulty: int | None = None
    ) -> None:
        super().__init__(message)
        self.seed = seed
        self.difficulty = difficulty
