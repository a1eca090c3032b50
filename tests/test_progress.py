"""latentcode.progress: the work said first, then plain lines in a log (throttled, the first and the
last step always) or a bar on a terminal, nothing when disabled."""

import io

from latentcode.progress import Progress, duration


def test_lines_in_a_log_every_step_when_the_interval_is_zero():
    stream = io.StringIO()
    progress = Progress(3, "work", unit="batch", stream=stream, interval=0.0)
    progress.announce("3 batches")
    assert list(progress.track("abc")) == ["a", "b", "c"]
    lines = stream.getvalue().splitlines()
    assert lines[0] == "work: 3 batches"
    assert [line.split(",")[0] for line in lines[1:]] == ["work: 1/3 batches", "work: 2/3 batches", "work: 3/3 batches"]


def test_lines_are_throttled_but_the_first_and_the_last_always_show():
    stream = io.StringIO()
    list(Progress(100, "work", stream=stream, interval=3600.0).track(range(100)))
    assert [line.split(",")[0] for line in stream.getvalue().splitlines()] == ["work: 1/100 steps", "work: 100/100 steps"]


def test_a_bar_on_a_terminal_and_nothing_when_disabled():
    stream = io.StringIO()
    list(Progress(4, "work", stream=stream, interactive=True).track(range(4)))
    assert "\r" in stream.getvalue() and "4/4" in stream.getvalue()  # tqdm redraws in place
    quiet = io.StringIO()
    progress = Progress(4, "work", stream=quiet, enabled=False, interactive=True)
    progress.announce("4 steps")
    list(progress.track(range(4)))
    assert quiet.getvalue() == ""


def test_duration_reads_as_a_person_would_say_it():
    assert (duration(12.34), duration(245), duration(3720)) == ("12.3 s", "4 min 05 s", "1 h 02 min")
