"""Attack: kill(-1), then the parent (the fork server), then pid 1, by signal and by pidfd.

Stopped by the nested Landlock domain of the child (signals cannot leave it) and the pid
namespace (nothing outside the sandbox is visible); pidfd_open is refused by seccomp.
kill(-1) returns 0 even when every process refused the signal (the kernel ignores EPERM for
it), so only the server's survival, which the test checks, tells whether it got through.
"""

import random
import signal

from shared.environment import Environment


class Quiet(Environment):
    name = "quiet"
    description = "Return a number."
    oracle = "equality"

    def sample(self, rng: random.Random, difficulty: int) -> dict:
        return {"n": rng.randint(0, 9)}

    def solve(self, instance: dict) -> int:
        return instance["n"]

    def render(self, instance: dict) -> str:
        return f"Repeat {instance['n']}."

    def score(self, instance: dict, reference: int, answer: str) -> float:
        os = random._os
        errors = []
        attempts = [
            ("kill(-1)", lambda: os.kill(-1, signal.SIGKILL)),
            ("kill(parent)", lambda: os.kill(os.getppid(), signal.SIGKILL)),
            ("stop(parent)", lambda: os.kill(os.getppid(), signal.SIGSTOP)),
            ("kill(1)", lambda: os.kill(1, signal.SIGKILL)),
            ("pidfd(parent)", lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)),
        ]
        for pid in range(1, 64):
            if pid != os.getpid():
                attempts.append((f"kill({pid})", lambda pid=pid: os.kill(pid, signal.SIGKILL)))
        for what, attempt in attempts:
            try:
                attempt()
                errors.append(f"{what}: sent")
            except OSError as exc:
                errors.append(f"{what}: {type(exc).__name__}")
        if any("sent" in error for error in errors[1:]):
            return 1.0
        raise PermissionError("; ".join(errors[:6]))
