"""The run report: PNG figures and a Markdown summary of one training run, read from the
archive's metric rows (`write_report`). Drawn on matplotlib `Figure` objects with the Agg
canvas: no pyplot, no display, no global state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from sqlmodel import select

from evoenv_cli import tree_memory
from shared.db import Archive, EnvironmentRow, MetricRow
from shared.messages import MECHANICAL_STAGES, MODEL_STAGES

FUNNEL_STAGES: tuple[str, ...] = (*MECHANICAL_STAGES, *MODEL_STAGES, "admitted")
BUCKET_STEPS = 10
GENERATOR_STEPS = 5
"""Optimiser steps per row of report.md's generator table."""
PAST_L5: tuple[str, ...] = (*MODEL_STAGES, "admitted")
"""Where a candidate that passed L1-L5 stops: at a model stage, or nowhere (admitted)."""
HEADLINE_STEPS = 5
GROUPS_SHOWN = 50
"""report.md lists the last this many generation groups, candidate by candidate."""
IMPLIED_CASE: dict[str, str] = {
    **{stage: stage for stage in MECHANICAL_STAGES},
    "calibration": "calibration",
    "novelty": "too similar",
    "admitted": "new",
}
"""The reward's case that a funnel outcome implies (the case is shown where it differs)."""
DPI = 150
ROLES = {"solver": "tab:blue", "generator": "tab:orange"}
REWARD_RANGE = {"solver": (0.0, 1.0)}
"""Where a role's rewards lie (a solver's score is in [0, 1]): its band is clipped to it."""


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    figures: dict[str, Path]
    """Figure name (reward, eval_pass_rate, ...) -> its PNG."""

    @property
    def paths(self) -> list[Path]:
        return [*self.figures.values(), self.markdown]


@dataclass(frozen=True)
class RunData:
    run: str
    train: list[MetricRow]
    evals: list[MetricRow]
    admitted: list[EnvironmentRow]
    """Environments admitted to the pool (seeds excluded), whatever their status now."""
    generations: list[MetricRow] = field(default_factory=list)
    """One row per generation group, in the order they were finalised (kind `generation`)."""

    def series(self, key: str, rows: Sequence[MetricRow] | None = None) -> dict[int, float]:
        """step -> value of `key`, over the steps whose row holds a finite number for it."""
        found = {}
        for row in self.train if rows is None else rows:
            value = _number(row.values.get(key))
            if value is not None:
                found[row.step] = value
        return found


def load(archive: Archive, run: str) -> RunData:
    admitted = [
        row
        for row in archive.environments()
        if row.origin != "seed" and (row.status == "admitted" or row.stats.admitted_at is not None)
    ]
    train, evals = archive.metrics(run, "train"), archive.metrics(run, "eval")
    return RunData(run, train, evals, admitted, archive.metrics(run, "generation"))


def write_report(
    archive: Archive, run: str, folder: Path, *, run_dir: Path | None = None
) -> ReportFiles:
    """Write the figures and report.md of `run` into `folder`; the settings.json shown is read
    from `run_dir` (default: `folder`). The metric rows are of kind "train" (one per optimiser
    step) and "eval" (one per held-out evaluation). The files:

        reward.png          solver and generator reward per step (batch mean, band of one std)
        eval_pass_rate.png  held-out pass rate per evaluation with its 95 % Wilson interval
        funnel.png          where generated candidates stopped, per 10 steps (stacked bars)
        pool_size.png       active pool size (seeds + admitted) per step
        difficulty.png      calibration and serving difficulty of the admitted environments
        push_latency.png    seconds per weight push (write the weights, reload every server)
        throughput.png      tokens per second through the trainer
        report.md           the headline numbers, the funnel's totals, the generator per 5
                            steps, the last generation groups candidate by candidate
                            (outcome and reward), the figures, and the run's settings.json

    A figure with nothing to show yet is still written, with a "no data yet" panel, so a report
    of a run that has not stepped has the same files. The funnel_<stage> values of the train
    rows are cumulative counts; the funnel figure plots their increments per 10 steps, and
    report.md's generator table per 5: candidates judged, how many passed L1-L5 (share), how
    many stopped at each later stage that occurs in the run, were admitted, or expired (not
    judged). Environments carry no run name in the archive: the difficulty figure covers every
    environment admitted to it (one data folder per run keeps that to the run's own)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = load(archive, run)
    figures: dict[str, Path] = {}
    for name, (_, draw) in FIGURES.items():
        figure = Figure(
            figsize=(7.5, 6.0) if name == "reward" else (7.5, 4.2), layout="constrained"
        )
        FigureCanvasAgg(figure)
        draw(figure, data)
        figures[name] = folder / f"{name}.png"
        figure.savefig(figures[name], dpi=DPI, facecolor="white", bbox_inches="tight")
    settings_file = (run_dir or folder) / "settings.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else None
    markdown = folder / "report.md"
    memory = tree_memory.read((run_dir or folder) / "logs" / tree_memory.MEMORY_LOG)
    text = render_markdown(data, figures, settings, archive_url(archive))
    markdown.write_text(text + "\n" + "\n".join(memory_section(memory)) + "\n")
    return ReportFiles(markdown, figures)


def memory_section(samples: Sequence[dict[str, Any]]) -> list[str]:
    """The memory of every process of the run together (`tree_memory`: sampled every 10 s by
    `evoenv up`), as Markdown lines: the peak, and each child's own peak."""
    lines = ["## Peak memory", ""]
    top = tree_memory.peak(list(samples))
    if top is None:
        return [*lines, "No memory samples (RUN/logs/memory.jsonl is written by `evoenv up`)."]
    at = datetime.fromtimestamp(float(top["at"]), UTC).strftime("%H:%M:%S UTC")
    lines += [
        f"All processes of the run together: **{top['pss_gib']:.2f} GiB** (proportional set "
        f"size; resident sum {top['rss_gib']:.2f} GiB) at {at}, the largest of "
        f"{top['samples']} samples over {top['seconds'] / 60:.0f} minutes.",
        "",
        "| process (with its descendants) | peak GiB |",
        "| --- | ---: |",
    ]
    peaks = sorted(top["by_child_peak"].items(), key=lambda item: -item[1])
    return lines + [f"| {name} | {gib:.2f} |" for name, gib in peaks]


def recorded_runs(archive: Archive) -> list[str]:
    """The runs with metrics in the archive."""
    with archive.session() as session:
        return sorted(session.exec(select(MetricRow.run).distinct()))


def archive_url(archive: Archive) -> str:
    return archive.engine.url.render_as_string(hide_password=True)


# ---------------------------------------------------------------------------------- figures


def _placeholder(ax: Axes, title: str) -> None:
    ax.set_title(title)
    ax.text(
        0.5,
        0.5,
        "no data yet",
        ha="center",
        va="center",
        fontsize=14,
        color="0.45",
        transform=ax.transAxes,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def _style(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if xlabel == "optimiser step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def draw_reward(figure: Figure, data: RunData) -> None:
    figure.suptitle(f"Reward per optimiser step, run {data.run}")
    steps = [row.step for row in data.train]
    for ax, (role, colour) in zip(figure.subplots(2, 1), ROLES.items(), strict=True):
        title = f"{role.capitalize()} reward"
        mean = data.series(f"reward_mean_{role}")
        if not mean:
            _placeholder(ax, title)
            continue
        std = data.series(f"reward_std_{role}")
        xs = sorted(mean)
        ax.plot(
            xs,
            [mean[s] for s in xs],
            color=colour,
            marker="." if len(xs) <= 100 else None,
            label="batch mean",
        )
        banded = [s for s in xs if s in std]
        if len(banded) == 1:  # one step: a band has no width, draw the spread as a bar
            (only,) = banded
            ax.errorbar(
                [only],
                [mean[only]],
                yerr=[std[only]],
                color=colour,
                alpha=0.4,
                capsize=6,
                label="± 1 std within the batch",
            )
        elif banded:
            low, high = REWARD_RANGE.get(role, (-math.inf, math.inf))
            ax.fill_between(
                banded,
                [max(low, mean[s] - std[s]) for s in banded],
                [min(high, mean[s] + std[s]) for s in banded],
                color=colour,
                alpha=0.2,
                linewidth=0,
                label="± 1 std within the batch",
            )
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        _style(ax, title, "optimiser step", "reward")
        ax.legend(loc="best", fontsize="small")


def draw_eval(figure: Figure, data: RunData) -> None:
    ax = figure.subplots()
    title = "Held-out pass rate (greedy)"
    rate = data.series("pass_rate", data.evals)
    if not rate:
        _placeholder(ax, title)
        return
    xs = sorted(rate)
    low, high = data.series("ci_low", data.evals), data.series("ci_high", data.evals)
    below = [rate[s] - low.get(s, rate[s]) for s in xs]
    above = [high.get(s, rate[s]) - rate[s] for s in xs]
    envs = sorted({k for row in data.evals for k in row.values if k.startswith("pass_rate_")})
    if len(envs) <= 10:
        for key in envs:
            per_env = data.series(key, data.evals)
            ax.plot(
                sorted(per_env),
                [per_env[s] for s in sorted(per_env)],
                linewidth=1,
                alpha=0.45,
                marker=".",
                label=key.removeprefix("pass_rate_"),
            )
    ax.errorbar(
        xs,
        [rate[s] for s in xs],
        yerr=[below, above],
        fmt="o-",
        color="black",
        capsize=4,
        linewidth=2,
        label="all environments, 95 % interval",
    )
    lenient = data.series("lenient_pass_rate", data.evals)
    if lenient:
        ax.plot(
            sorted(lenient),
            [lenient[s] for s in sorted(lenient)],
            "s--",
            color="grey",
            linewidth=1.5,
            label="all environments, the answer taken leniently",
        )
    instances = {row.values.get("instances") for row in data.evals} - {None}
    if len(instances) == 1:
        title += f", {instances.pop()} instances per evaluation"
    ax.set_ylim(-0.03, 1.03)
    _style(ax, title, "optimiser step", "pass rate")
    if len(xs) <= 15:
        ax.set_xticks(xs)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def funnel_buckets(
    train: Sequence[MetricRow], size: int = BUCKET_STEPS
) -> tuple[list[str], list[dict[str, int]]]:
    """The stages (in funnel order) and, per bucket of `size` steps (steps 1 to `size`, then
    the next `size`...), how many candidates stopped at each: increments of the cumulative
    funnel_<stage> counters (a counter that goes down was reset, by a fresh start, and counts
    again from zero)."""
    seen = {
        k.removeprefix("funnel_") for row in train for k in row.values if k.startswith("funnel_")
    }
    stages = [*FUNNEL_STAGES, *sorted(seen - set(FUNNEL_STAGES))]
    if not train:
        return stages, []
    buckets = [
        dict.fromkeys(stages, 0) for _ in range(max(max(r.step for r in train) - 1, 0) // size + 1)
    ]
    previous = dict.fromkeys(stages, 0)
    for row in train:
        bucket = buckets[max(row.step - 1, 0) // size]
        for stage in stages:
            count = int(_number(row.values.get(f"funnel_{stage}")) or 0)
            bucket[stage] += count - previous[stage] if count >= previous[stage] else count
            previous[stage] = count
    return stages, buckets


def funnel_totals(train: Sequence[MetricRow]) -> dict[str, int]:
    """How many candidates stopped at each stage over the whole run, in funnel order."""
    stages, buckets = funnel_buckets(train)
    return {stage: sum(b[stage] for b in buckets) for stage in stages}


@dataclass(frozen=True)
class GeneratorRow:
    """The candidates counted in optimiser steps `first` to `last`."""

    first: int
    last: int
    judged: int
    """Candidates that reached a verdict: every outcome but expired."""
    passed: int
    """Of those, the ones that passed L1-L5 (stopped at a model stage, or admitted)."""
    stopped: dict[str, int]
    """Column -> candidates: each stage after L5 that occurs in the run (in funnel order,
    "error" included), then admitted, then expired (candidates of a group past its deadline)."""


def generator_rows(train: Sequence[MetricRow], size: int = GENERATOR_STEPS) -> list[GeneratorRow]:
    """One row per `size` optimiser steps (the last one may be partial); none when no
    candidate was counted."""
    stages, buckets = funnel_buckets(train, size)
    occurring = {stage for bucket in buckets for stage, n in bucket.items() if n}
    if not occurring:
        return []
    fixed = ("admitted", "expired")
    later = [s for s in stages if s in occurring and s not in (*MECHANICAL_STAGES, *fixed)]
    last_step = max(row.step for row in train)
    return [
        GeneratorRow(
            first=i * size + 1,
            last=min((i + 1) * size, last_step),
            judged=sum(n for stage, n in bucket.items() if stage != "expired"),
            passed=sum(bucket.get(stage, 0) for stage in PAST_L5),
            stopped={column: bucket.get(column, 0) for column in (*later, *fixed)},
        )
        for i, bucket in enumerate(buckets)
    ]


def _stage_colours(stages: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    mechanical, model = colormaps["Oranges"], colormaps["Purples"]
    colours: dict[str, Any] = {}
    for i, stage in enumerate(MECHANICAL_STAGES):
        colours[stage] = mechanical(0.3 + 0.6 * i / max(len(MECHANICAL_STAGES) - 1, 1))
    for i, stage in enumerate(MODEL_STAGES):
        colours[stage] = model(0.4 + 0.45 * i / max(len(MODEL_STAGES) - 1, 1))
    colours["admitted"] = "tab:green"
    return {s: colours.get(s, "0.6") for s in stages}


def draw_funnel(figure: Figure, data: RunData) -> None:
    ax = figure.subplots()
    title = f"Admission funnel: where generated candidates stopped, per {BUCKET_STEPS} steps"
    stages, buckets = funnel_buckets(data.train)
    if not any(any(b.values()) for b in buckets):
        _placeholder(ax, title)
        return
    xs = list(range(len(buckets)))
    bottom = [0] * len(buckets)
    colours = _stage_colours(stages)
    for stage in stages:
        heights = [b[stage] for b in buckets]
        if any(heights):
            label = "admitted" if stage == "admitted" else f"stopped at {stage}"
            ax.bar(
                xs,
                heights,
                bottom=bottom,
                color=colours[stage],
                edgecolor="white",
                linewidth=0.5,
                label=label,
            )
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    every = math.ceil(len(xs) / 12)
    ax.set_xticks(xs[::every], [_bucket_label(i) for i in xs[::every]])
    if len(xs) > 6:
        ax.tick_params(axis="x", labelrotation=40)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _style(ax, title, "optimiser steps", "candidates")
    ax.grid(axis="x", visible=False)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small"
    )


def _bucket_label(index: int) -> str:
    return f"{index * BUCKET_STEPS + 1}–{(index + 1) * BUCKET_STEPS}"


def draw_pool(figure: Figure, data: RunData) -> None:
    ax = figure.subplots()
    title = "Pool size (seeds + admitted environments)"
    pool = data.series("pool")
    if not pool:
        _placeholder(ax, title)
        return
    xs = sorted(pool)
    ax.step(xs, [pool[s] for s in xs], where="post", color="tab:green", linewidth=2)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _style(ax, title, "optimiser step", "environments in the pool")


def difficulties(rows: Sequence[EnvironmentRow]) -> tuple[list[int], list[int]]:
    """The calibration difficulty (at admission) and the serving difficulty (now) of `rows`,
    where recorded."""
    calibrated, serving = [], []
    for row in rows:
        stats = row.stats
        level = stats.calibration.difficulty if stats.calibration is not None else None
        level = stats.calibration_difficulty if level is None else level
        if level is not None:
            calibrated.append(level)
        if stats.serving_difficulty is not None:
            serving.append(stats.serving_difficulty)
    return calibrated, serving


def draw_difficulty(figure: Figure, data: RunData) -> None:
    ax = figure.subplots()
    title = f"Difficulty of the admitted environments (n = {len(data.admitted)})"
    calibrated, serving = difficulties(data.admitted)
    if not calibrated and not serving:
        _placeholder(ax, title)
        return
    levels = list(range(min(calibrated + serving), max(calibrated + serving) + 1))
    for offset, values, colour, label in (
        (-0.2, calibrated, "tab:purple", "calibrated at admission"),
        (0.2, serving, "tab:cyan", "served now, after the difficulty search"),
    ):
        if values:
            ax.bar(
                [lv + offset for lv in levels],
                [values.count(lv) for lv in levels],
                width=0.4,
                color=colour,
                label=f"{label} ({len(values)})",
            )
    ax.set_xticks(levels)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _style(ax, title, "difficulty level", "environments")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="best", fontsize="small")


def _per_step(
    key: str, title: str, ylabel: str, unit: str, colour: str, point: str
) -> Callable[..., None]:
    """A line of `key` per step, with its rolling and overall means; `point`: what one value
    stands for (a push, a step)."""

    def draw(figure: Figure, data: RunData) -> None:
        ax = figure.subplots()
        values = data.series(key)
        if not values:
            _placeholder(ax, title)
            return
        xs = sorted(values)
        ys = [values[s] for s in xs]
        ax.plot(
            xs,
            ys,
            color=colour,
            marker="." if len(xs) <= 100 else None,
            linewidth=1,
            label=f"each {point}",
        )
        if len(ys) >= 10:
            window = max(5, len(ys) // 20)
            rolling = [
                sum(ys[max(0, i - window + 1) : i + 1]) / min(i + 1, window) for i in range(len(ys))
            ]
            ax.plot(
                xs,
                rolling,
                color="black",
                linewidth=1.5,
                label=f"rolling mean of {window} {point}s",
            )
        mean = sum(ys) / len(ys)
        ax.axhline(
            mean,
            color="0.4",
            linestyle="--",
            linewidth=1,
            label=f"mean {mean:.0f} {unit}" if mean >= 100 else f"mean {mean:.3g} {unit}",
        )
        ax.set_ylim(bottom=0)
        _style(ax, title, "optimiser step", ylabel)
        ax.legend(loc="best", fontsize="small")

    return draw


FIGURES: dict[str, tuple[str, Callable[[Figure, RunData], None]]] = {
    "reward": ("Solver and generator reward per optimiser step", draw_reward),
    "eval_pass_rate": ("Held-out pass rate per evaluation, 95 % Wilson interval", draw_eval),
    "funnel": (f"Admission funnel per {BUCKET_STEPS} steps", draw_funnel),
    "pool_size": ("Pool size per step", draw_pool),
    "difficulty": ("Difficulty distribution of the admitted environments", draw_difficulty),
    "push_latency": (
        "Weight-push latency per push",
        _per_step(
            "push_seconds",
            "Weight-push latency (write + reload on every server)",
            "seconds per push",
            "s",
            "tab:red",
            "push",
        ),
    ),
    "throughput": (
        "Trainer throughput per step",
        _per_step(
            "tokens_per_second",
            "Trainer throughput (prompt + completion tokens)",
            "tokens / second",
            "tokens/s",
            "tab:blue",
            "step",
        ),
    ),
}


# --------------------------------------------------------------------------------- markdown


def headline(data: RunData) -> list[tuple[str, str]]:
    """The headline numbers, as (what, value) rows."""
    rows: list[tuple[str, str]] = []
    train = data.train
    if train:
        span = (
            f"step {train[0].step}"
            if len(train) == 1
            else f"steps {train[0].step}–{train[-1].step}"
        )
        rows.append(("optimiser steps recorded", f"{len(train)} ({span})"))
        rows.append(
            ("final policy version", str(train[-1].values.get("version", train[-1].version)))
        )
    else:
        rows.append(("optimiser steps recorded", "0 (no training step recorded yet)"))
    for role in ROLES:
        reward = data.series(f"reward_mean_{role}")
        if reward:
            xs = sorted(reward)
            if len(xs) == 1:
                rows.append((f"{role} reward, step {xs[0]}", f"{reward[xs[0]]:.3f}"))
                continue
            # The two ends may not overlap: with 3 steps, the first and the last one.
            k = min(HEADLINE_STEPS, len(xs) // 2)
            first, last = xs[:k], xs[-k:]
            label = (
                f"step {first[0]} → step {last[0]}"
                if k == 1
                else f"first {k} → last {k} steps ({first[0]}–{first[-1]}, {last[0]}–{last[-1]})"
            )
            rows.append(
                (
                    f"{role} reward, {label}",
                    f"{_mean([reward[s] for s in first]):.3f} → {_mean([reward[s] for s in last]):.3f}",
                )
            )
    if data.evals:
        ends = [data.evals[0], data.evals[-1]] if len(data.evals) > 1 else [data.evals[0]]
        rows.append(
            ("held-out pass rate, first → last evaluation", " → ".join(_eval_text(r) for r in ends))
        )
        if all("lenient_pass_rate" in r.values for r in ends):
            rows.append(
                (
                    "held-out lenient pass rate (the answer taken leniently), first → last",
                    " → ".join(_eval_text(r, "lenient_") for r in ends),
                )
            )
        rows.append(("evaluations", str(len(data.evals))))
    totals = funnel_totals(train)
    candidates = sum(totals.values())
    if candidates:
        rows.append(("generated candidates judged (funnel)", str(candidates)))
        rows.append(
            (
                "admitted from the funnel",
                f"{totals['admitted']} ({100 * totals['admitted'] / candidates:.1f} %)",
            )
        )
    now = sum(row.status == "admitted" for row in data.admitted)
    rows.append(
        ("environments admitted in the archive", f"{len(data.admitted)} ({now} still in the pool)")
    )
    if any("forged_dropped" in row.values for row in train):
        rows.append(
            (
                "stream entries dropped: not signed by a worker / a reward out of range",
                f"{counter_total(train, 'forged_dropped')} / "
                f"{counter_total(train, 'out_of_range_dropped')}",
            )
        )
    rows += dishonest_rows(data)
    if pool := data.series("pool"):
        rows.append(("pool size at the last step", str(int(pool[max(pool)]))))
    if push := data.series("push_seconds"):
        rows.append(
            (
                "mean weight-push latency",
                f"{_mean(list(push.values())):.3f} s over {len(push)} pushes",
            )
        )
    if speed := data.series("tokens_per_second"):
        rows.append(("mean throughput", f"{_mean(list(speed.values())):.1f} tokens/s"))
    if peak := data.series("peak_rss_gib"):
        top = max(peak, key=lambda step: peak[step])
        rows.append(
            (
                "learner's peak memory per step (its high-water mark)",
                f"mean {_mean(list(peak.values())):.2f} GiB, max {peak[top]:.2f} GiB at step {top}",
            )
        )
    return rows


def dishonest_rows(data: RunData) -> list[tuple[str, str]]:
    """The headline's row of environments quarantined as dishonest and the groups of
    quarantined environments the learner dropped untrained (none when none was)."""
    dishonest = quarantined_dishonest(data.admitted)
    dropped = counter_total(data.train, "quarantined_dropped")
    if not dishonest and not dropped:
        return []
    what = (
        "environments quarantined as dishonest (a hidden probe or a re-score disagreed) / "
        "groups of quarantined environments dropped untrained"
    )
    return [(what, f"{len(dishonest)} / {dropped}")]


def quarantined_dishonest(rows: Sequence[EnvironmentRow]) -> list[EnvironmentRow]:
    """The environments of `rows` quarantined because their scorer disagreed with itself in
    training (a hidden probe or a re-score: `Pool.record_dishonest`)."""
    return [
        row
        for row in rows
        if row.status == "quarantined"
        and row.stats.quarantine is not None
        and row.stats.quarantine.reason.startswith("dishonest")
    ]


def counter_total(train: Sequence[MetricRow], key: str) -> int:
    """A learner's counter over the whole run: it restarts from 0 with each learner process, so
    a value below the one before starts a new count (as the funnel counters do)."""
    total = last = 0
    for row in train:
        value = int(_number(row.values.get(key)) or 0)
        total += value - last if value >= last else value
        last = value
    return total


def _eval_text(row: MetricRow, kind: str = "") -> str:
    """An evaluation's pass rate (`kind` "lenient_": its lenient one) with its interval."""
    rate = _number(row.values.get(f"{kind}pass_rate")) or 0.0
    low, high = _number(row.values.get(f"{kind}ci_low")), _number(row.values.get(f"{kind}ci_high"))
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    constant = _number(row.values.get("constant_pass_rate")) if not kind else None
    beside = f" (best constant answer {constant:.3f})" if constant is not None else ""
    return f"{rate:.3f}{interval}{beside} at step {row.step}"


def render_markdown(
    data: RunData, figures: dict[str, Path], settings: dict[str, Any] | None, source: str
) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Run report: {data.run}", "", f"Written {stamp} from the archive `{source}`.", ""]
    lines += ["## Headline numbers", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {what} | {value} |" for what, value in headline(data)]
    lines += ["", "## Admission funnel", "", *funnel_table(data.train, data.admitted)]
    lines += ["", "## Admitted environments", "", *admitted_table(data.admitted, settings)]
    lines += ["", f"## The generator, per {GENERATOR_STEPS} steps", ""]
    lines += [*generator_table(data.train), "", "## Generation groups", ""]
    lines += [*groups_table(data.generations), "", "## Figures", ""]
    for name, path in figures.items():
        lines += [
            f"![{FIGURES[name][0]}]({path.name})",
            "",
            f"*{FIGURES[name][0]}* (`{path.name}`)",
            "",
        ]
    lines += ["## Settings", ""]
    if settings is None:
        lines.append("No `settings.json` in the run folder.")
    else:
        lines += [
            "From the run folder's `settings.json`.",
            "",
            "| setting | value |",
            "| --- | --- |",
        ]
        lines += [f"| `{key}` | `{value}` |" for key, value in _flatten(settings)]
    return "\n".join(lines) + "\n"


def admitted_table(
    admitted: Sequence[EnvironmentRow], settings: dict[str, Any] | None = None
) -> list[str]:
    """Every generated environment admitted in the run: its novelty (similarity to the
    nearest pool member), calibration (pass rate at its difficulty), serving difficulty now,
    status, and its page on `evoenv pool serve` (at the run's `pool_web` address)."""
    if not admitted:
        return ["None admitted."]
    web = (settings or {}).get("pool_web") or {}
    base = f"http://{web.get('host', '127.0.0.1')}:{web.get('port', 8100)}"
    lines = [
        f"Each links to its page on `evoenv pool serve` ({base}).",
        "",
        "| environment | novelty: similarity (nearest) | calibration: pass rate at difficulty "
        "| serving difficulty | status |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for row in admitted:
        stats = row.stats
        novelty = stats.novelty
        near = (
            f"{novelty.similarity:.3f} ({novelty.nearest})"
            if novelty is not None and novelty.similarity is not None
            else "-"
        )
        figures = stats.calibration
        level = stats.calibration_difficulty
        if level is None and figures is not None:
            level = figures.difficulty
        calibration = (
            f"{figures.pass_rate:.3f} ({figures.passes}/{figures.instances}) at {level}"
            if figures is not None and figures.pass_rate is not None
            else "-"
        )
        serving = stats.serving_difficulty if stats.serving_difficulty is not None else "-"
        lines.append(
            f"| [`{row.name}`]({base}/env/{row.sha}) | {near} | {calibration} | {serving} "
            f"| {row.status} |"
        )
    return lines


def funnel_table(train: Sequence[MetricRow], admitted: Sequence[EnvironmentRow] = ()) -> list[str]:
    """Where each generated candidate stopped, totals over the run, as Markdown lines; then
    the admitted environments quarantined since, as dishonest, each with what was seen."""
    totals = funnel_totals(train)
    candidates = sum(totals.values())
    lines = ["No generated candidate judged yet."]
    if candidates:
        lines = ["Where each generated candidate stopped (totals over the run).", ""]
        lines += ["| stage | candidates | share |", "| --- | ---: | ---: |"]
        lines += [f"| {s} | {n} | {100 * n / candidates:.1f} % |" for s, n in totals.items()]
    if dishonest := quarantined_dishonest(admitted):
        lines += [
            "",
            f"Admitted, then quarantined as dishonest in training: {len(dishonest)} (its "
            "scorer disagreed with itself on a graded group; those groups and every later one "
            "of it were dropped untrained).",
            "",
        ]
        for row in dishonest:
            quarantine = row.stats.quarantine
            why = quarantine.reason.removeprefix("dishonest: ") if quarantine else ""
            lines.append(f"- `{row.name}` ({row.sha[:12]}): {why}")
    return lines


def generator_table(train: Sequence[MetricRow]) -> list[str]:
    """`generator_rows` as Markdown lines: one row per GENERATOR_STEPS steps."""
    rows = generator_rows(train)
    if not rows:
        return [f"No generated candidate judged yet, in any {GENERATOR_STEPS} steps."]
    columns = list(rows[0].stopped)
    intro = (
        f"Per {GENERATOR_STEPS} optimiser steps, the generated candidates counted in them: "
        "judged (they reached a verdict), how many of those passed L1–L5 and their share, "
        "then how many stopped at each later stage, were admitted, or expired (their "
        "generation group passed its deadline: not judged)."
    )
    if "error" in columns:
        intro += " `error`: a check could not run (judged, not counted as passing L1–L5)."
    lines = [
        intro,
        "",
        f"| steps | judged | passed L1–L5 | share | {' | '.join(columns)} |",
        "| --- |" + " ---: |" * (3 + len(columns)),
    ]
    for row in rows:
        steps = f"{row.first}–{row.last}" if row.last > row.first else str(row.first)
        share = f"{100 * row.passed / row.judged:.1f} %" if row.judged else "–"
        counts = " | ".join(str(n) for n in row.stopped.values())
        lines.append(f"| {steps} | {row.judged} | {row.passed} | {share} | {counts} |")
    return lines


def groups_table(rows: Sequence[MetricRow], shown: int = GROUPS_SHOWN) -> list[str]:
    """The last `shown` generation groups as Markdown lines, one a group: its candidates in
    candidate order, each its funnel outcome and reward, with the reward's case in brackets
    where the outcome does not imply it (a copy rejected at review: `review -0.50 (too
    similar)`)."""
    if not rows:
        return ["No generation group finalised yet."]
    last = list(rows)[-shown:]
    which = f"the last {len(last)} of {len(rows)}" if len(rows) > len(last) else "each"
    lines = [
        f"Generation groups, {which} in the order they were finalised: each candidate's "
        'outcome and generator reward, in candidate order (docs/CONTRACT.md, "The '
        "generator's reward\"). `error`: a check could not run (no reward). Mode: how the "
        "prompt asked (docs/DESIGN.md#proposal-modes).",
        "",
        "| # | group | mode | version | gamma | candidates: outcome reward |",
        "| ---: | --- | --- | ---: | ---: | --- |",
    ]
    for row in last:
        values = row.values
        cells = [_candidate_text(c) for c in values.get("candidates", [])]
        gamma = _number(values.get("gamma"))
        mode = str(values.get("mode", "topic"))
        if values.get("repair_of"):
            mode += f" of `{str(values['repair_of'])[:8]}`"
        lines.append(
            f"| {row.step} | `{str(values.get('group_id', ''))[:8]}` | {mode} | {row.version} | "
            f"{'–' if gamma is None else f'{gamma:.2f}'} | {' · '.join(cells)} |"
        )
    return lines


def _candidate_text(candidate: dict[str, Any]) -> str:
    outcome = str(candidate.get("outcome", "?"))
    reward = _number(candidate.get("reward"))
    text = f"{outcome} {'–' if reward is None else f'{reward:+.2f}'}"
    case = candidate.get("case")
    if case and case != IMPLIED_CASE.get(outcome):
        text += f" ({case})"
    return text


def _flatten(settings: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", json.dumps(value).replace("|", "\\|")))
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
