"""The experiment's records on disk, for the runner (runner.py): its name, opening or resuming it
(finished trials told to the study again, unfinished ones queued to restart), trial names and
directories, where a restarting trial picks up (its checkpoint, its results up to it), and
telling the study how a trial ended (one value, or one per objective; a Repeater's group of
repeats once, their mean, when the last ends)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import warnings
import time
from datetime import datetime

import optuna
from optuna.trial import TrialState

from raylite.tune import session
from raylite.tune.metrics import is_finite, lookup
from raylite.tune.search_space import path_name
from raylite.tune.storage import ExperimentStorage, StudyMirror, read_results, rewrite_results
from raylite.tune.trial import ERROR, PENDING, Trial

DIRNAME_MAX = int(os.environ.get("TUNE_MAX_LEN_IDENTIFIER", "130"))   # Ray's bound on a trial dirname's name part


def default_name(r, storage_path, resume: bool) -> str:
    """`<trainable>_<timestamp>`; with resume=True, the latest such experiment, if any."""
    root = ExperimentStorage(storage_path, "x").root
    prefix = f"{r.trainable_name}_"
    if resume and os.path.isdir(root):
        mine = [n for n in os.listdir(root) if n.startswith(prefix) and ExperimentStorage(root, n).exists()]
        if mine:
            return max(mine, key=lambda n: os.path.getmtime(os.path.join(root, n)))
    base = f"{prefix}{datetime.now():%Y-%m-%d_%H-%M-%S}"
    name, i = base, 1
    while os.path.exists(os.path.join(root, name)):
        name, i = f"{base}_{i}", i + 1
    return name


def open_experiment(r) -> None:
    st = r.storage
    existing = st.exists()
    if existing and not r.resume:
        raise ValueError(f"experiment {r.name!r} already exists at {st.path}: pass resume=True to continue "
                         f"it, or another name (or storage_path)")
    direction = "maximize" if r.mode == "max" else "minimize"
    objectives = r.searcher.objectives   # several: one direction each (multi-objective OptunaSearch)
    if objectives:
        direction = ["maximize" if m == "max" else "minimize" for _, m in objectives]
    r.study = optuna.create_study(sampler=r.searcher.sampler, pruner=r.scheduler.make_pruner(),
                                     **({"directions": direction} if objectives else {"direction": direction}),
                                     **r.searcher.study_args(r.name))
    # a study in the user's storage (OptunaSearch(storage=...)) may hold this experiment's trials already
    r.told = {t.user_attrs.get("trial_id") for t in r.study.get_trials(deepcopy=False)}
    r.searcher.setup_study(r.study)
    r.mirror = StudyMirror(st.study_url, r.name, direction)   # its writer starts with a trial
    meta = st.load_meta() if existing else {}
    r.exp_tag = meta.get("exp_tag") or os.urandom(3).hex()[:5]
    r.meta = {"name": r.name, "trainable": r.trainable_name, "exp_tag": r.exp_tag,
                 "metric": r.metric, "mode": r.mode, "num_samples": r.num_samples, "objectives": objectives,
                 "total_trials": r.total_trials, "resources_per_trial": r.resources,
                 "search_alg": r.searcher.describe(), "scheduler": type(r.scheduler).__name__,
                 "created": meta.get("created", time.time()), "status": "running"}
    st.save_meta(r.meta)
    if not existing:
        return
    groups: dict = {}   # a Repeater's groups: (first, size) -> [members], the shared Optuna trial
    for t in st.load_trials():
        r.trials.append(t)
        r.by_id[t.trial_id] = t
        if t.status == ERROR and r.errored:
            reopen_errored(r, t)
        group = groups.setdefault(tuple(t.optuna["group"]), [[], None]) if t.optuna.get("group") else None
        if group is not None:
            group[0].append(t)
        if t.is_finished:
            if group is None:
                restore_finished(r, t)
        else:
            group_ot = restore_unfinished(r, t, group[1] if group else None)
            if group is not None:
                group[1] = group_ot
    for (first, size), (members, ot) in groups.items():
        restore_group(r, first, size, members, ot)
    if r.reporter.verbose:
        done = sum(t.is_finished for t in r.trials)
        r.reporter._print(f"Resuming {r.name}: {done} finished trials kept, {len(r.pending)} to "
                             f"(re)start from their latest checkpoint if any")


def restore_finished(r, t: Trial) -> None:
    o = t.optuna
    if not o.get("params") and not o.get("distributions"):
        return
    state = TrialState[o.get("state", "FAIL")]
    value = o.get("value")
    if state == TrialState.COMPLETE and value is None:
        state = TrialState.FAIL
    frozen = optuna.trial.create_trial(
        state=state, params=o.get("params", {}),
        **{"values" if isinstance(value, list) else "value": value if state != TrialState.FAIL else None},
        distributions={k: optuna.distributions.json_to_distribution(v) for k, v in o["distributions"].items()},
        intermediate_values={int(k): v for k, v in (o.get("intermediate") or {}).items()},
        system_attrs=o.get("system_attrs") or {}, user_attrs={"trial_id": t.trial_id})
    if t.trial_id not in r.told:
        r.study.add_trial(frozen)
    r.mirror.add(frozen)


def reopen_errored(r, t: Trial) -> None:
    """An errored trial runs again (resume="AUTO+ERRORED" / Tuner.restore(resume_errored=True)):
    from its latest checkpoint, or, with "restart", from scratch (its checkpoints and results
    are deleted)."""
    t.status, t.error_msg, t.num_failures, t.end_time = PENDING, None, 0, None
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(t.path, "error.txt"))
    if r.errored == "restart":
        for name in os.listdir(t.path):
            if name.startswith("checkpoint_"):
                shutil.rmtree(os.path.join(t.path, name), ignore_errors=True)
        rewrite_results(t.path, [])
        t.rewind([])
        for key in ("intermediate", "last_step", "next_rung"):   # the pruner sees it from step one again
            t.optuna.pop(key, None)


def restore_unfinished(r, t: Trial, ot=None):
    """Queue the trial to restart, with a new Optuna trial of its params (or `ot`: its group's)."""
    if ot is None:
        ot = r.searcher.restore(r.study, t.optuna.get("params", {}), t.optuna.get("distributions", {}))
        group = t.optuna.get("group")   # a group's Optuna trial is its first repeat's
        ot.set_user_attr("trial_id", f"{r.exp_tag}_{group[0]:05d}" if group else t.trial_id)
        for step, value in sorted((int(k), v) for k, v in (t.optuna.get("intermediate") or {}).items()):
            ot.report(value, step)
    t.optuna_trial = ot
    t.status, t.restored = PENDING, True
    r.pending.append(t)
    return ot


def restore_group(r, first: int, size: int, members: list, ot) -> None:
    """A Repeater's group after a resume: told again (the mean recomputed from its repeats' own
    records) if every repeat had ended; else its unfinished repeats share `ot` and tell it when the
    last ends. Repeats the killed driver had not created yet join it (Repeater.resume_group)."""
    primary = f"{r.exp_tag}_{first:05d}"
    if ot is None and len(members) == size:
        state, value = group_outcome(members)
        o = members[0].optuna
        frozen = optuna.trial.create_trial(
            state=state, params=o.get("params", {}),
            **{"values" if isinstance(value, list) else "value": value},
            distributions={k: optuna.distributions.json_to_distribution(v) for k, v in o["distributions"].items()},
            system_attrs=next((m.optuna["system_attrs"] for m in members if m.optuna.get("system_attrs")), {}),
            user_attrs={"trial_id": primary})
        if primary not in r.told:
            r.study.add_trial(frozen)
        r.mirror.add(frozen)
        return
    if len(members) < size:
        if ot is None:
            o = members[0].optuna
            ot = r.searcher.restore(r.study, o.get("params", {}), o.get("distributions", {}))
            ot.set_user_attr("trial_id", primary)
        r.searcher.resume_group(first, members[0].config, ot)


def experiment_tag(r, trial: Trial) -> str:
    """Ray's `experiment_tag`: the trial's index and its searched values, "3_lr=0.01,h=64"."""
    parts = []
    for path, _ in sorted(r.space.grids + r.space.domains, key=lambda pd: path_name(pd[0])):
        node = trial.config
        for key in path:
            node = node[key] if isinstance(node, (dict, list)) else None
        parts.append(f"{path[-1]}={node:.4g}" if isinstance(node, float) else f"{path[-1]}={node}")
    return f"{trial.index}_{','.join(parts)}" if parts else str(trial.index)


def dirname(r, trial: Trial) -> str:
    """Ray's trial directory name, `<trial name>_<experiment tag>_<date>` (or the
    trial_dirname_creator's, which must be a name, not a path), unique in the experiment."""
    if r.trial_dirname_creator is None:   # unique: the trial id is in it
        name = f"{trial}_{trial.experiment_tag}"[:DIRNAME_MAX] + f"_{datetime.now():%Y-%m-%d_%H-%M-%S}"
        return re.sub(r'[/()<>:"\\|?*]', "_", name)
    name = str(r.trial_dirname_creator(trial))
    if os.sep in name or name in ("", ".", ".."):
        raise ValueError(f"trial_dirname_creator returned {name!r}: a trial directory name must not be "
                         f"empty or contain {os.sep!r}")
    name = re.sub(r'[/()<>:"\\|?*]', "_", name)
    taken = {t.path for t in r.trials}   # trials sharing a directory would overwrite each other's records
    base, i = name, 1
    while r.storage.trial_dir(name) in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def rewind(r, trial: Trial) -> session.Checkpoint | None:
    """The checkpoint to restart from: the newest with every earlier result on disk (a driver
    killed mid-drain may have missed the last few results, not the checkpoints the trial wrote
    after them), else none. Results and checkpoints after it are dropped: the trial redoes them;
    so are the partial copies of a trial killed while it wrote a checkpoint."""
    results = read_results(trial.path)
    recorded = results[-1].get("training_iteration", 0) if results else 0
    upto, ckpt, stale = session.restart_point(trial.path, recorded)
    stale += [os.path.join(trial.path, n) for n in os.listdir(trial.path) if n.startswith("checkpoint_")
              and ".tmp" in n]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    meta = ckpt.metadata if ckpt else {}
    keep = [r for r in results if r.get("training_iteration", 0) <= upto]
    if upto and meta.get("result") and (not keep or keep[-1].get("training_iteration") != upto):
        keep.append(meta["result"])   # the driver died before it saw the checkpoint's result
    rewrite_results(trial.path, keep)
    trial.rewind(keep)
    trial.restored = False
    return ckpt


def _value(r, trial: Trial):
    """The trial's last metric value (a list, one per objective), or None if not all finite."""
    objectives = r.searcher.objectives
    if objectives:
        values = [lookup(trial.last_result, m) for m, _ in objectives]
        return [float(v) for v in values] if all(is_finite(v) for v in values) else None
    value = lookup(trial.last_result, r.metric) if r.metric else None
    return float(value) if is_finite(value) else None


def tell(r, trial: Trial, state: TrialState) -> None:
    """Tell the study how the trial ended. A repeat of a Repeater group records its own end
    (state, value) and the group's shared Optuna trial is told once, when its last repeat ends."""
    value = _value(r, trial)
    if trial.optuna.get("group"):
        trial.optuna.update(state=state.name, value=value)
        members = _ended_group(r, trial)
        if members is not None:
            _tell(r, trial, *group_outcome(members), own=False)
        return
    if state == TrialState.COMPLETE and value is None:
        state = TrialState.FAIL   # Optuna needs a value for a complete trial
    _tell(r, trial, state, value, own=True)


def _tell(r, trial: Trial, state: TrialState, value, own: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frozen = r.study.tell(trial.optuna_trial, value if state == TrialState.COMPLETE else None, state=state)
    # system_attrs hold the pruner's records (ASHA's rung values), which trials after a resume compete with
    trial.optuna.update(system_attrs=dict(frozen.system_attrs))
    if own:   # a group's repeats keep their own values (a resume recomputes the group's from them)
        trial.optuna.update(state=frozen.state.name, value=frozen.values if r.searcher.objectives else frozen.value)
    r.mirror.add(frozen)


def _ended_group(r, trial: Trial) -> list | None:
    """The trial's group once every repeat of it has ended (one that never will, withdrawn as the
    experiment stopped, is left out), else None."""
    first, size = trial.optuna["group"]
    members = [m for m in (r.by_id.get(f"{r.exp_tag}_{i:05d}") for i in range(first, first + size)) if m]
    if len(members) < size and not r.stopping:
        return None
    return members if all(m.is_finished and "state" in m.optuna for m in members) else None


def group_outcome(members: list) -> tuple[TrialState, object]:
    """Ray's Repeater: the mean of the repeats' values (per objective), those without one left
    out (np.nanmean); none at all: the group failed."""
    values = [m.optuna.get("value") for m in members if m.optuna.get("value") is not None]
    if not values:
        return TrialState.FAIL, None
    if isinstance(values[0], list):
        return TrialState.COMPLETE, [sum(col) / len(col) for col in zip(*values)]
    return TrialState.COMPLETE, sum(values) / len(values)


def discard(r, trial: Trial) -> None:
    """A trial withdrawn before it began (the experiment stopped) fails its Optuna trial; one of a
    group leaves it to the repeats that ran, told now if they all have ended."""
    if not trial.optuna.get("group"):
        r.study.tell(trial.optuna_trial, state=TrialState.FAIL)
        return
    first, size = trial.optuna["group"]
    if not any(r.by_id.get(f"{r.exp_tag}_{i:05d}") for i in range(first, first + size)):
        r.study.tell(trial.optuna_trial, state=TrialState.FAIL)
    elif not any(t.optuna.get("group") == [first, size] for t in r.pending) and \
            (members := _ended_group(r, trial)) is not None:   # the last of them withdrawn tells it
        _tell(r, trial, *group_outcome(members), own=False)
