"""A chaos run: `evoenv up` from a fresh data folder while faults are injected, then one table.

    python bench/chaos.py [--minutes 60] [--every 240] [--warmup 300] [--seed 0] [--data-dir D]
                          [--kinds worker,vllm,learner,flower,redis,sigstop,hostile]

`up` starts as a user starts it (defaults, JSON logs, but a checkpoint every step so that the
data folder holds the two kept long before half time: its growth is then that of a steady run), on a fresh data folder whose `models`
links to the user's prepared models (the default one prepared first if it is not). After
`--warmup` seconds, and then
every `--every`, one fault, the kinds taken in turn from a shuffled cycle so that each comes up:

- `worker`: SIGKILL of one Celery worker's process group (generation, validation or grading,
  in turn); `vllm`: SIGKILL of the server's process group; `flower`: the same for Flower;
- `learner`: SIGKILL of the learner (as the kernel's out-of-memory killer would);
- `redis`: SIGKILL of `up`'s Redis (the supervisor restarts it on its append-only file);
- `sigstop`: SIGSTOP of a worker (grading or validation) for the default visibility timeout
  (900 s) and 30 s more, then SIGCONT; the next faults come meanwhile (the run keeps the
  default time limits: a shorter visibility timeout had slow proposals delivered twice);
- `hostile`: a file of tests/corpus/hostile submitted as an ad-hoc job
  (`evoenv validate --queue --json`, found through the running `up`).

Recovery of a fault, from the run's logs: seconds from the fault until the broken part is back
(the supervisor's `child_restarted`) and the first job that depends on it has completed: a job
of that worker (when its queue was empty as it came back, the wait for work is left out); a
job of the generation worker (completion or proposal) after vLLM; the restarted learner's
first group read from the stream; after Redis, a job completed (its result and acknowledgement
written to the restarted server); after SIGCONT, a job of the stopped worker (counted from its
receipt when its queue was empty at the SIGCONT), or, where `up` replaced the silent worker
before the SIGCONT, its first job after the restart, counted from the SIGSTOP; the ad-hoc job's
report. Beside each, the
seconds to the next optimiser step (which also waits for the pipeline's next groups), and the
median gap between steps. At `--minutes` the stream is read, `up` gets SIGINT, and the checks
follow: groups trained twice into the weights that were kept (steps a resumed learner
rolled back do not count), graded groups neither trained into kept weights, skipped, dropped as
stale, nor still in the stream (lost), admitted environments per the generation groups' results
against the archive, processes of the run left a minute after the stop, the memory of the
children never restarted and the data folder's size at half time and at the end. Prints the
table and `chaos-summary: faults=N recovered_max_s=X lost=N twice=N left=N` last; writes
everything to DATA/chaos.json (`--analyse DATA` analyses the folder again). Exit 1 when a target is missed (see docs/results.md).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evoenv_cli.supervisor import command_pid, descendants  # noqa: E402
from evoenv_model.models import DEFAULT_MODEL, prepare_model  # noqa: E402
from shared.config import Settings, WorkerSettings  # noqa: E402

KINDS = ("worker", "vllm", "learner", "flower", "redis", "sigstop", "hostile")
WORKERS = ("worker-generation", "worker-validation", "worker-grading")
VISIBILITY = WorkerSettings().visibility_timeout
"""The default visibility timeout: a SIGSTOP lasts it and 30 s more."""
EVOENV = [sys.executable, "-c", "from evoenv_cli import main; main()"]
RUN_ENV = {"EVOENV_LEARNER__CHECKPOINT_EVERY": "1"}


def when(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def read_events(logs: Path) -> list[dict[str, Any]]:
    """Every JSON event with a timestamp in the run's logs, each with `_log` (its file's stem)
    and `_t` (seconds since the epoch), in time order."""
    out = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            start = line.find("{")
            if start < 0:
                continue
            with contextlib.suppress(ValueError, KeyError):
                event = json.loads(line[start:])
                event["_log"], event["_t"] = path.stem, when(event)
                out.append(event)
    return sorted(out, key=lambda e: e["_t"])


def child_pid(logs: Path, name: str) -> int | None:
    """The running command of `up`'s child `name` (the latest reaper's child)."""
    reapers = [
        int(e["pid"])
        for e in read_events(logs)
        if e.get("event") == "child_started" and e.get("child") == name
    ]
    return command_pid(reapers[-1]) if reapers else None


def redis_url(logs: Path) -> str:
    """The URL of the Redis the learner last started on."""
    started = [e for e in read_events(logs) if e.get("event") == "learner_started"]
    return str(started[-1]["settings"]["redis_url"])


def queued(logs: Path, queue: str) -> int | None:
    """Jobs waiting in `queue` now (None when Redis cannot say)."""
    import redis

    try:
        client = redis.Redis.from_url(redis_url(logs), socket_timeout=10)
        try:
            return int(client.llen(queue))
        finally:
            client.close()
    except Exception:  # noqa: BLE001 (None: the recovery is then measured from the SIGCONT)
        return None


def stream_group_ids(logs: Path) -> set[str]:
    """Group ids of the entries still in the run's rollout stream (read or not), from the Redis
    the learner last started on."""
    import redis

    from shared import keys
    from shared.rollouts import decode_entry

    client = redis.Redis.from_url(redis_url(logs), socket_timeout=10)
    ids = set()
    try:
        for _entry, fields in client.xrange(keys.rollout_stream("default")):
            with contextlib.suppress(Exception):
                ids.add(decode_entry(fields).group_id)
    finally:
        client.close()
    return ids


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (or of `path`, a file), links left out."""
    total = 0
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        with contextlib.suppress(OSError):
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
    return total


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.data = args.data_dir.resolve()
        self.logs = self.data / "runs" / "default" / "logs"
        self.faults: list[dict[str, Any]] = []
        self.cycle: list[str] = []
        self.turn = {"worker": 0, "sigstop": 0}
        self.ever: set[int] = set()
        self.half: dict[str, Any] = {}
        self.stopped: list[tuple[threading.Timer, dict[str, Any]]] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVOENV_")}
        return {**env, **RUN_ENV, "EVOENV_DATA_DIR": str(self.data), "EVOENV_LOG_FORMAT": "json"}

    def prepare(self) -> None:
        if self.data.exists() and any(self.data.iterdir()):
            raise SystemExit(f"error: {self.data} is not empty; give a fresh --data-dir")
        models = Settings().data_dir / "models"  # where the user keeps prepared models
        prepare_model(Settings(model=DEFAULT_MODEL, data_dir=models.parent))  # the one `up` serves
        (self.data / "models").mkdir(parents=True)
        for model in models.iterdir():
            (self.data / "models" / model.name).symlink_to(model.resolve())

    def next_kind(self) -> str:
        if not self.cycle:
            self.cycle = list(self.args.kinds)
            self.rng.shuffle(self.cycle)
        return self.cycle.pop(0)

    def inject(self, kind: str) -> dict[str, Any]:
        fault: dict[str, Any] = {"kind": kind, "at": time.time()}
        if kind in ("worker", "sigstop"):
            names = WORKERS if kind == "worker" else ("worker-grading", "worker-validation")
            name = names[self.turn[kind] % len(names)]
            self.turn[kind] += 1
        else:
            name = {"vllm": "vllm", "learner": "learner", "flower": "flower", "redis": "redis"}.get(
                kind, ""
            )
        fault["target"] = name or "validation queue"
        if kind == "hostile":
            files = sorted((REPO / "tests" / "corpus" / "hostile").glob("*.py"))
            path = self.rng.choice(files)
            fault["target"] = path.name
            done = subprocess.run(
                [*EVOENV, "validate", "--queue", "--json", str(path)],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=900,
            )
            fault["done"] = time.time()
            fault["rc"] = done.returncode
            fault["detail"] = (done.stdout.strip() or done.stderr.strip())[-300:]
            return fault
        pid = child_pid(self.logs, name)
        if pid is None:
            fault["detail"] = f"{name} not running: skipped"
            return fault
        fault["pid"] = pid
        if kind == "learner" or kind == "redis":
            os.kill(pid, signal.SIGKILL)
        elif kind == "sigstop":  # other faults go on while it is stopped
            os.killpg(pid, signal.SIGSTOP)
            resume = threading.Timer(VISIBILITY + 30, self.resume, args=(fault,))
            resume.daemon = True
            resume.start()
            self.stopped.append((resume, fault))
        else:
            os.killpg(pid, signal.SIGKILL)
        return fault

    def resume(self, fault: dict[str, Any]) -> None:
        """SIGCONT of a SIGSTOPped worker (once; a worker killed meanwhile is gone already)."""
        if "resumed" in fault:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(fault["pid"], signal.SIGCONT)
        fault["resumed"] = time.time()
        fault["queued_at_resume"] = queued(self.logs, str(fault["target"]).removeprefix("worker-"))
        print(f"chaos: resumed {json.dumps(fault)}", flush=True)

    def note_back(self) -> None:
        """For a killed worker, once it runs again: the jobs waiting in its queue then."""
        for fault in self.faults:
            if fault["kind"] == "worker" and "pid" in fault and "queued_at_back" not in fault:
                pid = child_pid(self.logs, str(fault["target"]))
                if pid is not None and pid != fault["pid"]:
                    queue = str(fault["target"]).removeprefix("worker-")
                    fault["queued_at_back"] = queued(self.logs, queue)

    def resume_all(self) -> None:
        for timer, fault in self.stopped:
            timer.cancel()
            self.resume(fault)

    def snapshot(self, started: float) -> dict[str, Any]:
        """Memory of each child (the memory sampler's last line) and the data folder's size."""
        lines = (self.logs / "memory.jsonl").read_text().splitlines()
        last = json.loads(lines[-1]) if lines else {}
        return {
            "minute": round((time.time() - started) / 60, 1),
            "by_child": last.get("by_child", {}),
            "pss_gib": last.get("pss_gib"),
            "data_bytes": folder_bytes(self.data),
            "data_by_folder": {
                str(path.relative_to(self.data)): folder_bytes(path)
                for path in [*self.data.iterdir(), *(self.data / "runs" / "default").glob("*")]
                if path.name != "runs"
            },
        }

    def run(self) -> int:
        self.prepare()
        minutes = self.args.minutes
        out = (self.data / "up.out").open("wb")
        proc = subprocess.Popen(
            [*EVOENV, "-v", "up"],
            cwd=REPO,
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started = time.time()
        end = started + minutes * 60
        next_fault = started + self.args.warmup
        print(f"chaos: `evoenv up` pid {proc.pid}, data {self.data}, {minutes} min", flush=True)
        try:
            while time.time() < end and proc.poll() is None:
                self.ever |= descendants(proc.pid)
                self.note_back()
                if not self.half and time.time() >= started + minutes * 30:
                    self.half = self.snapshot(started)
                if time.time() >= next_fault and time.time() < end - 120:
                    kind = self.next_kind()
                    if kind == "sigstop" and time.time() > end - VISIBILITY - 150:
                        kind = self.next_kind()  # its SIGCONT would come too late to measure
                    fault = self.inject(kind)
                    fault["minute"] = round((fault["at"] - started) / 60, 1)
                    self.faults.append(fault)
                    print(f"chaos: {json.dumps(fault)}", flush=True)
                    next_fault = time.time() + self.args.every
                time.sleep(2)
            self.resume_all()  # none is due this late (see above); a guard
            exited_early = proc.poll() is not None
            final = self.snapshot(started)
            snapshot_at = time.time()
            in_stream: set[str] = set()
            if not exited_early:
                try:
                    in_stream = stream_group_ids(self.logs)
                except Exception as exc:  # noqa: BLE001 (said; losses then count unread groups)
                    print(f"chaos: could not read the stream: {exc}", flush=True)
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(180)
        finally:
            self.resume_all()
            if proc.poll() is None:
                for pid in descendants(proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(60)
        time.sleep(60)
        left = sorted(pid for pid in self.ever if Path(f"/proc/{pid}").exists())
        state = {
            "exit_code": proc.returncode,
            "exited_early": exited_early,
            "left": left,
            "half": self.half,
            "final": final,
            "faults": self.faults,
            "in_stream": sorted(in_stream),
            "snapshot_at": snapshot_at,
        }
        (self.data / "chaos-state.json").write_text(json.dumps(state, indent=1, default=str))
        return finish(self.data, minutes)


def finish(data: Path, minutes: float) -> int:
    """Analyse a finished run from its folder (its logs, archive and chaos-state.json)."""
    state = json.loads((data / "chaos-state.json").read_text())
    logs = data / "runs" / "default" / "logs"
    result = analyse(
        read_events(logs), state["faults"], set(state["in_stream"]), state["snapshot_at"], data
    )
    result.update({k: v for k, v in state.items() if k != "in_stream"})
    (data / "chaos.json").write_text(json.dumps(result, indent=1, default=str))
    return report(result, minutes)


def first_after(events: list[dict[str, Any]], t: float, test: Any) -> float | None:
    return next((e["_t"] for e in events if e["_t"] > t and test(e)), None)


def recovery(events: list[dict[str, Any]], fault: dict[str, Any]) -> float | None:
    """Seconds from the fault until its part is back and a job depending on it completed."""
    kind, target, at = str(fault["kind"]), str(fault.get("target")), float(fault["at"])
    if "detail" in fault and kind != "hostile":
        return None
    if kind == "hostile":
        return fault["done"] - at if fault.get("rc") in (0, 1) else None

    def succeeded(log: str) -> Any:
        return lambda e: e["_log"] == log and "succeeded in" in str(e.get("event"))

    def restarted(name: str) -> Any:
        return lambda e: e.get("event") == "child_restarted" and e.get("child") == name

    if kind == "sigstop":
        replaced = first_after(events, at, restarted(target))
        if replaced is not None and replaced < float(fault["resumed"]):
            # `up` found it silent and replaced it: its first job after that, from the SIGSTOP
            return _end(first_after(events, replaced, succeeded(target)), at)
        resumed = float(fault["resumed"])
        done = first_after(events, resumed, succeeded(target))
        received = _received(events, target, done)
        if received is not None and received > resumed and fault.get("queued_at_resume") == 0:
            return _end(done, received)  # its queue was empty: the idle wait is not recovery
        return _end(done, resumed)
    back = first_after(events, at, restarted(target))
    if back is None:
        return None
    if kind == "worker":
        done = first_after(events, back, succeeded(target))
        received = _received(events, target, done)
        if received is not None and received > back and fault.get("queued_at_back") == 0:
            # its queue was empty when it came back: the wait for work is not recovery
            return _end(done, at + received - back)
    elif kind == "vllm":  # any job of the worker that calls the server (completion, proposal)
        done = first_after(events, back, succeeded("worker-generation"))
    elif kind == "learner":  # its consumer reads the stream again
        done = first_after(
            events, back, lambda e: e["_log"] == "learner" and e.get("event") == "group_read"
        )
    elif kind == "redis":  # a job completed: its result and acknowledgement went into it
        done = first_after(
            events, back, lambda e: e["_log"] in WORKERS and "succeeded in" in str(e.get("event"))
        )
    else:  # flower: back once it listens
        done = back
    return _end(done, at)


def next_step(events: list[dict[str, Any]], fault: dict[str, Any]) -> float | None:
    """Seconds from a fault to the next optimiser step (shown beside the learner's and Redis's
    recovery: a step also waits for the pipeline's next groups)."""
    at = float(fault["at"])
    return _end(first_after(events, at, lambda e: e.get("event") == "train_step"), at)


def _received(events: list[dict[str, Any]], log: str, done: float | None) -> float | None:
    """When the worker received the job whose success it logged at `done`."""
    success = next((e for e in events if e["_t"] == done and e["_log"] == log), None)
    found = re.search(r"\[([^\]]+)\] succeeded in", str(success and success.get("event")))
    if found is None:
        return None
    tag = f"[{found.group(1)}] received"
    return next((e["_t"] for e in events if e["_log"] == log and tag in str(e.get("event"))), None)


def _end(done: float | None, since: float) -> float | None:
    return None if done is None else round(done - since, 1)


def analyse(
    events: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    in_stream: set[str],
    snapshot_at: float,
    data: Path,
) -> dict[str, Any]:
    kept: dict[int, list[str]] = {}
    trained_ever: set[str] = set()
    for e in events:
        if e.get("event") == "learner_resumed":
            for step in [s for s in kept if s > int(e["step"])]:
                del kept[step]
        elif e.get("event") == "train_step":
            groups = [str(g) for g in e.get("groups_trained") or []]
            kept[int(e["step"])] = groups
            trained_ever.update(groups)
    counts: dict[str, int] = {}
    for groups in kept.values():
        for g in groups:
            counts[g] = counts.get(g, 0) + 1
    twice = sorted(g for g, n in counts.items() if n > 1)
    before = [e for e in events if e["_t"] <= snapshot_at]
    graded = {str(e["group_id"]) for e in before if e.get("event") == "group_graded"}
    graded |= {str(e["group_id"]) for e in before if e.get("event") == "generation_group_done"}
    # held-out evaluations and the serving-difficulty search are graded too, each into a run of
    # its own (RUN-eval, RUN-serving): not the trainer's
    trainer = next(
        (str(e["run"]) for e in events if e.get("event") == "learner_started" and "run" in e),
        "default",
    )
    runs = re.compile(r"'run': '([^']*)', 'group_id': '([0-9a-f]+)'")
    graded -= {
        group for e in events for run, group in runs.findall(str(e.get("event"))) if run != trainer
    }
    settled = {str(e.get("group")) for e in events if e.get("event") in (
        "group_skipped", "rollout_stale", "rollout_stale_at_step")}  # fmt: skip
    lost = sorted(graded - set(counts) - settled - in_stream)
    steps = [e["_t"] for e in events if e.get("event") == "train_step"]
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    admitted_events = sum(
        list(e.get("funnel") or []).count("admitted")
        for e in events
        if e.get("event") == "generation_group_done"
    )
    from shared.db import Archive

    archive = Archive(f"sqlite:///{data / 'archive.db'}")
    admitted_archive = sum(
        1
        for status in ("admitted", "retired", "quarantined")
        for row in archive.environments(status)
        if row.origin != "seed"
    )
    restarted = {str(e.get("child")) for e in events if e.get("event") == "child_restarted"}
    return {
        "recoveries": [recovery(events, f) for f in faults],
        "next_steps": [next_step(events, f) for f in faults],
        "median_step_gap_s": round(statistics.median(gaps), 1) if gaps else None,
        "steps": len(kept),
        "twice": twice,
        "graded": len(graded),
        "lost": lost,
        "in_stream": len(in_stream),
        "admitted_events": admitted_events,
        "admitted_archive": admitted_archive,
        "restarted_children": sorted(restarted),
    }


def report(r: dict[str, Any], minutes: float) -> int:
    faults, recoveries = r["faults"], r["recoveries"]
    nexts = r.get("next_steps") or [None] * len(faults)
    print("\n| fault | target | minute | recovery s | next step s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for fault, seconds, step in zip(faults, recoveries, nexts, strict=True):
        shown, after = ("-" if v is None else f"{v:.0f}" for v in (seconds, step))
        print(
            f"| {fault['kind']} | {fault.get('target')} | {fault['minute']} | {shown} | {after} |"
        )
    print(f"\nmedian gap between steps: {r['median_step_gap_s']} s; kept steps {r['steps']}")
    whole = [c for c in r["final"]["by_child"] if c not in r["restarted_children"]]
    half, final = r["half"].get("by_child", {}), r["final"]["by_child"]
    print("\n| never restarted | GiB at half time | GiB at the end | growth |")
    print("| --- | ---: | ---: | ---: |")
    growth = []
    for child in whole:
        a, b = half.get(child), final.get(child)
        if a and b and a > 0.05:
            growth.append((b - a) / a)
            print(f"| {child} | {a:.2f} | {b:.2f} | {100 * (b - a) / a:+.1f} % |")
    da, db = r["half"].get("data_bytes", 0), r["final"]["data_bytes"]
    folder = (db - da) / da if da else 0.0
    print(f"\ndata folder: {da / 2**30:.2f} GiB at half time, {db / 2**30:.2f} GiB at the end")
    parts = r["half"].get("data_by_folder", {}), r["final"].get("data_by_folder", {})
    for name in sorted(set(parts[0]) | set(parts[1])):
        a, b = (part.get(name, 0) / 2**30 for part in parts)
        if max(a, b) >= 0.01:
            print(f"  {name}: {a:.2f} -> {b:.2f} GiB")
    print(
        f"graded groups {r['graded']}, lost {len(r['lost'])}, trained twice into kept weights "
        f"{len(r['twice'])}, still in the stream {r['in_stream']}; admitted per the groups "
        f"{r['admitted_events']}, in the archive {r['admitted_archive']}; processes left "
        f"{len(r['left'])}; up's exit code {r['exit_code']}"
    )
    known = [s for s in recoveries if s is not None]
    worst = max(known, default=0.0)
    unrecovered = len(recoveries) - len(known)
    print(
        f"chaos-summary: faults={len(faults)} recovered_max_s={worst:.0f} "
        f"unrecovered={unrecovered} lost={len(r['lost'])} twice={len(r['twice'])} "
        f"left={len(r['left'])}"
    )
    ok = (
        len(faults) >= (12 if minutes >= 60 else 1)
        and unrecovered == 0
        and worst < 180
        and not r["lost"]
        and not r["twice"]
        and not r["left"]
        and r["admitted_events"] == r["admitted_archive"]
        and all(g < 0.10 for g in growth)
        and folder < 0.10
        and not r["exited_early"]
    )
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=240.0, help="seconds between faults")
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds before the first")
    parser.add_argument("--seed", type=int, default=0, help="the order of the fault kinds")
    parser.add_argument(
        "--kinds",
        type=lambda text: [k for k in text.split(",") if k],
        default=list(KINDS),
        help=f"comma-separated fault kinds, of {','.join(KINDS)} (default: all)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / ".cache" / "evoenv" / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    parser.add_argument(
        "--analyse", type=Path, metavar="DATA", help="analyse a finished run's folder again"
    )
    args = parser.parse_args()
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown or not args.kinds:
        parser.error(f"unknown fault kind(s) {', '.join(unknown) or '(none)'}; of {KINDS}")
    if args.analyse:
        sys.exit(finish(args.analyse, args.minutes))
    sys.exit(Chaos(args).run())


if __name__ == "__main__":
    main()
