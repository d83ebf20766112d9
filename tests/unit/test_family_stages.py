"""The family's stage scheduler (raydiff.orchestrate.family.run_stages) with stand-in commands:
which stage starts when, what a failed stage stops, what the command's error then says, and a
stop passed on to the running stages. (The whole family on a cluster, stopped and continued:
tests/integration/test_family.py.)"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import IO

import pytest

from raydiff.errors import RunFailedError, RunInterruptedError
from raydiff.orchestrate import family
from raydiff.orchestrate.family import StageRun, raise_if_failed, run_stages

TRAININGS = ("base", "classifier", "upsampler", "evaluator")


class Command:
    """A stand-in for a stage's ``raydiff`` process: it ends with ``code`` after ``polls`` looks,
    having written ``last`` to the stage's log; or never, until a signal (``polls`` None)."""

    def __init__(self, *, code: int, last: str, polls: int | None, log: IO[bytes]) -> None:
        self.code, self.polls, self.signals = code, polls, []
        log.write(f"{last}\n".encode())
        log.flush()

    def poll(self) -> int | None:
        if self.polls is None:
            return None
        self.polls -= 1
        return self.code if self.polls < 0 else None

    def send_signal(self, number: int) -> None:
        self.signals.append(number)
        self.polls = 0

    def wait(self, timeout: float) -> int:
        return self.code

    def kill(self) -> None:
        raise AssertionError("a stage that leaves when asked is not killed")


class Launcher:
    """Starts the stand-ins: ``argv[0]`` ``fail`` ends with status 1, ``hang`` runs until
    stopped, anything else ends well; ``started`` lists the command lines in order."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []
        self.commands: list[Command] = []

    def __call__(self, argv: list[str], log: IO[bytes]) -> Command:
        self.started.append(argv)
        if argv[0] == "fail":
            command = Command(
                code=1, last="raydiff train: error: cannot continue", polls=1, log=log
            )
        else:
            polls = None if argv[0] == "hang" else 2
            command = Command(code=0, last=f"{argv[0]} done", polls=polls, log=log)
        self.commands.append(command)
        return command


def stage(name: str, tmp_path: Path, *commands: list[str], needs: tuple[str, ...] = ()) -> StageRun:
    return StageRun(
        name=name, needs=needs, commands=lambda: list(commands), log=tmp_path / f"{name}.log"
    )


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(family, "POLL_SECONDS", 0.0)


def test_a_failed_stage_stops_what_needs_it_and_the_independent_ones_finish(
    tmp_path: Path,
) -> None:
    def sample_commands() -> list[list[str]]:
        raise AssertionError("the sample stage's commands need the upsampler's checkpoint")

    stages = [
        stage(name, tmp_path, ["fail" if name == "upsampler" else "train", name])
        for name in TRAININGS
    ]
    stages.append(
        StageRun(
            name="sample",
            needs=("base", "classifier", "upsampler"),
            commands=sample_commands,
            log=tmp_path / "sample.log",
        )
    )
    launch = Launcher()
    run_stages(stages, out=tmp_path, launch=launch)
    assert [argv[1] for argv in launch.started] == list(TRAININGS)  # all at once, none waits
    states = {s.name: s.state for s in stages}
    assert states == {
        "base": "done",
        "classifier": "done",
        "upsampler": "failed",
        "evaluator": "done",
        "sample": "skipped",
    }
    with pytest.raises(RunFailedError) as failed:
        raise_if_failed(stages)
    log = tmp_path / "upsampler.log"
    assert str(failed.value) == (
        "stage upsampler failed (exit status 1: raydiff train: error: cannot continue); "
        f"its log: {log}; not run: sample; finished: base, classifier, evaluator. "
        "Run the same command again to continue"
    )
    assert log.read_text().splitlines() == [
        "$ raydiff fail upsampler",
        "raydiff train: error: cannot continue",
    ]


def test_a_stage_starts_once_its_needs_are_done_and_runs_its_commands_in_turn(
    tmp_path: Path,
) -> None:
    """Its commands are built when it starts (a finished training builds none: it is skipped),
    one after the other; a stage whose commands cannot be built fails with the reason."""

    def no_checkpoint() -> list[list[str]]:
        raise RunFailedError("stage evaluator finished without a checkpoint")

    stages = [
        stage("base", tmp_path, ["train", "base"]),
        stage("classifier", tmp_path),  # finished before
        stage("sample", tmp_path, ["ema", "base"], ["sample", "guided"],
              needs=("base", "classifier")),
        StageRun(name="evaluator", needs=(), commands=no_checkpoint, log=tmp_path / "e.log"),
    ]  # fmt: skip
    launch = Launcher()
    run_stages(stages, out=tmp_path, launch=launch)
    assert launch.started == [["train", "base"], ["ema", "base"], ["sample", "guided"]]
    assert [(s.state, s.note) for s in stages] == [
        ("done", "finished"),
        ("done", "finished before: skipped"),
        ("done", "finished"),
        ("failed", "stage evaluator finished without a checkpoint"),
    ]
    assert (tmp_path / "sample.log").read_text().splitlines() == [
        "$ raydiff ema base",
        "ema done",
        "$ raydiff sample guided",
        "sample done",
    ]
    raise_if_failed(stages[:3])  # nothing failed: no error


def test_a_stop_is_passed_on_to_every_running_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while two stages run: each gets SIGINT once and is waited for; the stages
    waiting for them do not start, and the command says how to continue."""
    stages = [
        stage("base", tmp_path, ["hang", "base"]),
        stage("upsampler", tmp_path, ["hang", "upsampler"]),
        stage("sample", tmp_path, ["sample"], needs=("base", "upsampler")),
    ]
    launch = Launcher()
    looks = iter(range(3))

    def sleep(seconds: float) -> None:
        if next(looks) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(family.time, "sleep", sleep)
    with pytest.raises(RunInterruptedError) as stopped:
        run_stages(stages, out=tmp_path, launch=launch)
    assert "stopped the stages base, upsampler" in str(stopped.value)
    assert "run the same command again to continue" in str(stopped.value)
    assert [c.signals for c in launch.commands] == [[signal.SIGINT], [signal.SIGINT]]
    assert [s.state for s in stages] == ["failed", "failed", "waiting"]


def test_a_family_in_a_bucket_continues_each_stage_s_log_there(tmp_path: Path) -> None:
    """With ``DIR`` a URI (mock:// here) a stage's console goes to a local file that is copied
    to ``DIR/logs/<stage>.log`` when it ends; a rerun's stage appends to the log found there,
    and the error names the bucket's copy (the local file is gone with the family)."""
    from raydiff.storage import MirroredFolder, as_location

    logs = MirroredFolder(as_location("mock:///bucket/family/logs"))
    (logs.target / "base.log").write_text("$ raydiff train base\nstopped\n")  # an earlier run

    def in_bucket(name: str, *command: str) -> StageRun:
        return StageRun(
            name=name,
            needs=(),
            commands=lambda: [list(command)],
            log=logs.local / f"{name}.log",
            logs=logs,
        )

    stages = [in_bucket("base", "train", "base"), in_bucket("upsampler", "fail", "upsampler")]
    try:
        run_stages(stages, out=logs.target.parent, launch=Launcher())
        with pytest.raises(RunFailedError, match="its log: mock:///bucket/family/logs/ups"):
            raise_if_failed(stages)
        assert (logs.target / "base.log").read_text().splitlines() == [
            "$ raydiff train base",
            "stopped",
            "$ raydiff train base",
            "train done",
        ]
        assert (logs.target / "upsampler.log").read_text().splitlines() == [
            "$ raydiff fail upsampler",
            "raydiff train: error: cannot continue",
        ]
    finally:
        logs.close()
