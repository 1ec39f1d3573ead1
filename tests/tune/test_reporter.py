"""`progress_reporter=`: Ray's CLIReporter shapes raylite's status table (metric and parameter
columns, rows, frequency; other arguments warn); a ProgressReporter subclass gets Ray's calls."""
import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402


def trainable(config):
    for i in range(2):
        tune.report({"loss": config["x"] + i, "acc": 0.5 + i / 4})


SPACE = {"x": tune.grid_search([1.0, 2.0]), "y": 3}


def test_cli_reporter_columns(ray_module, tmp_path, capsys):
    reporter = tune.CLIReporter(metric_columns={"acc": "Accuracy"}, parameter_columns=["x"],
                                max_report_frequency=1)
    tune.run(trainable, config={**SPACE, "z": tune.uniform(0, 1)}, metric="loss", mode="min",
             storage_path=str(tmp_path), name="cli", progress_reporter=reporter)
    summary = capsys.readouterr().out.split("== Summary ==")[-1]
    header = next(line for line in summary.splitlines() if line.startswith("| Trial name"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "Trial name", "status", "x", "iter", "total time (s)", "loss", "Accuracy", "note"]
    assert "| 0.75" in summary   # the last acc of each trial


def test_ignored_arguments_warn_and_types_checked():
    with pytest.warns(UserWarning, match="sort_by_metric ignored"):
        tune.JupyterNotebookReporter(sort_by_metric=True, max_progress_rows=5)
    with pytest.raises(TypeError, match="unexpected"):
        tune.CLIReporter(no_such_thing=1)
    reporter = tune.CLIReporter(metric_columns=["acc"])
    reporter.add_metric_column("loss")
    with pytest.raises(ValueError, match="already exists"):
        reporter.add_metric_column("acc")
    with pytest.raises(TypeError, match="progress_reporter must be"):
        tune.run(trainable, config=SPACE, progress_reporter="cli")


def test_custom_reporter_gets_rays_calls(ray_module, tmp_path):
    class Recorder(tune.ProgressReporter):
        def __init__(self):
            self.calls = []

        def setup(self, start_time=None, total_samples=None, metric=None, mode=None, **kwargs):
            self.calls.append(("setup", total_samples, metric))

        def should_report(self, trials, done=False):
            return True

        def report(self, trials, done, *sys_info):
            self.calls.append(("report", len(trials), done))

    recorder = Recorder()
    tune.Tuner(trainable, param_space=SPACE, tune_config=tune.TuneConfig(metric="loss", mode="min"),
               run_config=tune.RunConfig(name="custom", storage_path=str(tmp_path),
                                         progress_reporter=recorder)).fit()
    assert recorder.calls[0] == ("setup", 2, "loss")
    assert recorder.calls[-1] == ("report", 2, True)
