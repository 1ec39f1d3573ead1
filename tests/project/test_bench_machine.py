"""bench/machine.py: the context line the bench scripts print beside their figures."""
import sys

from helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import machine  # noqa: E402

STAT = """cpu  100 5 50 800 10 0 5 30 7 0
cpu0 50 2 25 400 5 0 2 15 3 0
intr 12345
"""


def test_ticks_come_from_the_all_cpus_line_and_steal_is_the_eighth_field():
    assert machine.cpu_ticks(STAT) == (100 + 5 + 50 + 800 + 10 + 0 + 5 + 30, 30)   # guest time is in user already
    assert machine.cpu_ticks("intr 1\n") is None and machine.cpu_ticks("cpu 1 2 3\n") is None


def test_stolen_share_is_the_steal_between_two_readings():
    later = STAT.replace("cpu  100 5 50 800 10 0 5 30", "cpu  150 5 60 1000 10 0 5 70")
    share = machine.stolen_share(machine.cpu_ticks(STAT), machine.cpu_ticks(later))
    assert share == 40 / (50 + 10 + 200 + 40)
    assert machine.stolen_share(None, (1, 0)) is None
    assert machine.stolen_share((5, 1), (5, 1)) is None   # no time passed: no share to speak of


def test_the_line_names_the_load_the_python_speed_and_the_steal():
    ctx = machine.Context()
    assert ctx.ns > 0
    line = ctx.line()
    assert line.startswith("machine: ") and "load average" in line and "ns an iteration" in line
    if machine.cpu_ticks() is not None:   # Linux
        assert "taken by the hypervisor" in line
    assert set(ctx.figures()) == {"load", "python_ns_per_iteration", "stolen_share"}
