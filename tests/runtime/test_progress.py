"""headcount.runtime.progress: the two modes (a terminal's redrawn line, a log's rate-limited lines),
the ETA arithmetic, stderr only; the study's plan and estimate lines; ``score``'s progress off a terminal."""

from __future__ import annotations

import io

from headcount.experiments.runner.progress import Reporter, estimate_line, estimate_seconds, plan_line
from headcount.runtime.progress import PLAIN_EVERY_S, LinesTo, Progress, TqdmLines, duration, eta_seconds


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_eta_is_the_work_left_at_the_mean_rate():
    assert eta_seconds(25, 100, 10.0) == 30.0
    assert eta_seconds(100, 100, 10.0) == 0.0
    assert eta_seconds(0, 100, 10.0) is None and eta_seconds(3, None, 10.0) is None
    assert duration(59.6) == "1m00s" and duration(3599) == "59m59s" and duration(3600) == "1h00m"


def test_plain_mode_writes_at_most_one_line_per_interval_and_the_final_line():
    clock, out = Clock(), io.StringIO()
    p = Progress(1000, "scoring (gradient)", unit="examples", stream=out, clock=clock, quiet=0)
    assert not p.terminal
    for i in range(1, 1001):  # one example per 0.125 s (exact in binary): 125 s in all
        clock.t = 100.0 + i * 0.125
        p.update(i)
    p.close()
    p.close()  # once
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # the first line, one per 30 s (at 30, 60, 90, 120 s) and the final one
    assert len(lines) == 2 + int(125 // PLAIN_EVERY_S), lines
    assert lines[0] == "scoring (gradient): 0/1000 examples"
    assert lines[1].startswith("scoring (gradient): 240/1000 examples (24%), 8 examples/s, 30s elapsed, ETA 1m35s")
    assert lines[-1] == "scoring (gradient): 1000/1000 examples (100%), 8 examples/s, 2m05s elapsed"


def test_terminal_mode_redraws_one_line_in_place():
    clock, out = Clock(), Tty()
    p = Progress(10, "pruning", unit="steps", stream=out, clock=clock, quiet=0)
    assert p.terminal
    for i in range(1, 11):
        clock.t += 1.0
        p.update(i, detail=f"{100 - i} heads kept")
    p.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn
    assert text.count("\r") == 12  # the first draw, each update (1 s apart > the redraw interval), the final one
    assert text.rstrip("\n").rsplit("\r\x1b[2K", 1)[-1] == "pruning: 10/10 steps (100%), 1 steps/s, 10s elapsed; 90 heads kept"


def test_progress_goes_to_stderr_never_stdout(capsys):
    p = Progress(4, "scoring", unit="examples", quiet=0)
    p.update(4)
    p.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert "scoring: 4/4 examples" in err


def test_unknown_total_has_no_eta():
    clock, out = Clock(), io.StringIO()
    p = Progress(None, "pruning", unit="steps", stream=out, clock=clock, every=1.0)
    clock.t += 2.0
    p.update(4)
    assert out.getvalue().splitlines()[-1] == "pruning: 4 steps, 2 steps/s, 2s elapsed"


def test_a_tqdm_bar_becomes_a_few_lines_in_a_log():
    clock, out = Clock(), io.StringIO()
    s = TqdmLines(out, clock=clock, terminal=False)
    for i in range(101):  # 1 s apart, \r-redrawn as tqdm does, and its closing newline
        clock.t += 1.0
        s.write(f"\rLoading weights: {i}%|###| {i}/100")
    s.write("\n")
    s.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "Loading weights: 0%|###| 0/100" and lines[-1] == "Loading weights: 100%|###| 100/100"
    assert len(lines) == 5  # 0, 30, 60, 90 s and the last state: not one giant line of 101 states


def test_lines_to_a_message_callback():
    said, clock = [], Clock()
    p = Progress(10, "training", unit="steps", stream=LinesTo(said.append), clock=clock, quiet=0)
    clock.t += PLAIN_EVERY_S
    p.update(5)
    assert said == ["training: 0/10 steps", "training: 5/10 steps (50%), 0.167 steps/s, 30s elapsed, ETA 30s"]


def test_plan_line_counts_the_jobs_by_kind():
    assert plan_line(["score", "prune", "score", "finetune"], reused=2) == \
        "plan: 4 jobs to run (score 2, finetune 1, prune 1); 2 reused"
    assert plan_line(["score"]) == "plan: 1 job to run (score 1)"


def test_estimate_uses_this_runs_finished_jobs_and_says_it_is_an_estimate():
    timed = [("finetune", 60.0), ("finetune", 40.0), ("score", 10.0)]
    # finetune: its mean 50; score: 10; evaluate (none timed): the mean of all, 110 / 3
    assert estimate_seconds(["finetune", "score", "evaluate"], timed) == 50 + 10 + 110 / 3
    line = estimate_line(["finetune", "score"], timed)
    assert line.startswith("estimate: about 1m00s (an estimate") and "3 finished jobs" in line
    assert estimate_line(["score"], []).startswith("estimate: none yet")


def test_reporter_prints_the_plan_first_and_job_k_of_n_with_eta():
    from rich.console import Console

    from headcount.experiments.runner.jobs import Job

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    jobs = [Job(f"s{i}", "score", "math:fsum", {"x": i}) for i in range(3)]
    with Reporter(3, reused=1, console=console, pending=jobs, timed=[("score", 4.0)]) as r:
        for j in jobs:
            r.job_started(j)
            r.job_finished(j, 2.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "plan: 3 jobs to run (score 3); 1 reused"
    assert lines[1].startswith("estimate: about 12s (an estimate")
    done = [line for line in lines if line.startswith("done")]
    assert done[0].endswith("(2.0 s; job 1/3, ETA ~6s)")  # 2 score jobs left at the mean of 4, 2: 3 s
    assert done[-1].endswith("(2.0 s; job 3/3)")


def test_a_logs_lines_are_not_folded_at_the_console_width():
    """Off a terminal every runner line is one line, however long (rich folds at 80 columns
    otherwise: a step's ETA landed on a line of its own in a study's log)."""
    from types import SimpleNamespace

    from rich.console import Console

    out = io.StringIO()
    clock = Clock()
    job = SimpleNamespace(key="k" * 16, name="finetune/tweets/seed1-with-a-long-name", kind="finetune")
    with Reporter(1, console=Console(file=out, width=80, force_terminal=False), clock=clock) as r:
        r.job_started(job)
        clock.t += PLAIN_EVERY_S + 1
        r.step(job, 0)
        clock.t += PLAIN_EVERY_S + 1
        r.step(job, 1, 32, "training: 1/32 steps (3%), 0.015 steps/s, 1m07s elapsed, ETA 34m32s")
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert any("ETA 34m32s" in line and "finetune/tweets/seed1-with-a-long-name" in line for line in lines), lines
    assert any(line.startswith("start finetune/tweets/seed1-with-a-long-name") and job.key in line for line in lines)


def test_a_step_done_within_the_quiet_time_prints_nothing():
    """A step that ends before QUIET_S seconds writes no line at all (a quick command's stderr is
    its one error line); one that runs longer starts writing then, and ends with its final line."""
    from headcount.runtime.progress import QUIET_S

    def run(step: float) -> str:  # 8 examples, one every ``step`` seconds
        clock, out = Clock(), io.StringIO()
        p = Progress(8, "scoring", unit="examples", stream=out, clock=clock)
        for i in range(1, 9):
            clock.t += step
            p.update(i)
        p.close()
        return out.getvalue()

    assert run(QUIET_S / 10) == ""
    out = run(QUIET_S / 2)
    lines = out.splitlines()
    assert lines[0].startswith("scoring: 2/8 examples") and lines[-1].startswith("scoring: 8/8 examples")
    assert len(lines) == 2  # the first after the quiet time, the final; none between within 30 s
