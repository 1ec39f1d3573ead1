"""The ``raylite`` command (also ``python -m raylite``): what a running driver is doing.

Each driver that runs the local runtime is a session with a control endpoint (raylite.control);
these commands ask the newest one, or the one ``--session`` names (its id, a prefix of it, or
the driver's pid). ``--format json`` prints the answer as JSON for scripts. Exit status: 0 done,
1 no session or the session failed to answer, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from raylite.cli import tables
from raylite.control import SessionError, find_session, list_sessions

# what `raylite list` shows, and the state API type whose fields are its columns
_LIST_KINDS = {"tasks": "TaskState", "actors": "ActorState", "objects": "ObjectState", "workers": "WorkerState",
               "nodes": "NodeState", "placement_groups": "PlacementGroupState", "jobs": "JobState"}
_RAY_HINT = "(for a program on the Ray backend use Ray's own `ray status`, `ray list` and dashboard)"
FOLLOW_INTERVAL_S = 0.5


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--session", help="session id (or its prefix, or the driver's pid); default: the newest")
    common.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    p = argparse.ArgumentParser(prog="raylite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="resources, tasks, actors, objects, Tune and Train")
    sub.add_parser("sessions", parents=[common], help="the running sessions")
    ls = sub.add_parser("list", parents=[common], help="list tasks, actors, objects, workers, ...")
    ls.add_argument("what", choices=tuple(_LIST_KINDS))
    ls.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                    help="keep rows whose KEY is VALUE (KEY!=VALUE: is not); repeatable")
    ls.add_argument("--limit", type=int, default=100, help="at most this many rows (default 100)")
    ls.add_argument("--detail", action="store_true", help="all columns")
    sm = sub.add_parser("summary", parents=[common], help="tasks, actors or objects, counted by state")
    sm.add_argument("what", choices=("tasks", "actors", "objects"))
    tl = sub.add_parser("timeline", parents=[common], help="finished tasks as a Chrome trace")
    tl.add_argument("-o", "--output", help="the trace file (default: timeline-<session>.json here)")
    lg = sub.add_parser("logs", parents=[common], help="recent worker output")
    who = lg.add_mutually_exclusive_group()
    who.add_argument("--worker", type=int, metavar="PID", help="only this worker process's lines")
    who.add_argument("--actor", metavar="ID", help="only the lines of this actor's worker")
    lg.add_argument("--tail", type=int, default=0, metavar="N", help="only the last N lines")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the driver ends")
    st = sub.add_parser("stop", parents=[common], help="ask a driver to shut down, as Ctrl-C would")
    st.add_argument("--all", action="store_true", help="every running session")
    st.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it to exit (default 30)")
    return p


def _filters(raw: list[str]) -> list[list[str]]:
    out = []
    for item in raw:
        key, op, value = (item.partition("!=") if "!=" in item else item.partition("="))
        if not op or not key.strip():
            raise SessionError(f"--filter takes KEY=VALUE or KEY!=VALUE, got --filter {item!r}", "ValueError")
        out.append([key.strip(), op, value.strip()])
    return out


def _columns(what: str, detail: bool) -> list[str]:
    from raylite.util import state
    cls = getattr(state, _LIST_KINDS[what])
    return list(cls.fields) if detail else [f for f in cls.fields if f in cls.base]


def _emit(args, data, text) -> None:
    print(json.dumps(data, indent=2, default=str) if args.format == "json" else text())


def _logs(args, session) -> int:
    pid = args.worker
    if args.actor is not None:
        actors = session.request("list", what="actors", filters=[["actor_id", "=", args.actor]], limit=1)
        if not actors or actors[0].get("pid") is None:
            raise SessionError(f"no actor with --actor {args.actor!r} has a worker in session {session.id}",
                               "ValueError")
        pid = actors[0]["pid"]
    got = session.request("logs", pid=pid, limit=args.tail)
    if got["log_dir"] and not args.follow:   # init(log_to_driver=False): workers write their own files
        print(f"raylite: this driver's workers write their output to files in {got['log_dir']}", file=sys.stderr)
    while True:
        for entry in got["lines"]:
            if args.format == "json":
                print(json.dumps(entry), flush=True)
            else:
                print(f"({entry['name']} pid={entry['pid']}) {entry['line']}", flush=True)
        if not args.follow:
            return 0
        time.sleep(FOLLOW_INTERVAL_S)
        try:
            got = session.request("logs", after=got["next"], pid=pid)
        except SessionError as e:
            if e.kind == "SessionGone" or not session.alive():
                return 0   # the driver is ending (its endpoint closes first) or has ended: so does following it
            raise


def _stop(args) -> int:
    targets = list_sessions() if args.all else [find_session(args.session)]
    if not targets:
        raise SessionError("no raylite session is running")
    for session in targets:
        session.request("stop")
        deadline = time.monotonic() + args.timeout
        while session.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if session.alive():
            raise SessionError(f"session {session.id} (pid {session.pid}) was asked to stop but still runs after "
                               f"{args.timeout:g} s (its program may catch KeyboardInterrupt); `kill {session.pid}` "
                               f"ends it")
        print(f"Stopped session {session.id} (pid {session.pid})")
    return 0


def _run(args) -> int:
    if args.command == "stop":
        return _stop(args)
    if args.command == "sessions":
        found = list_sessions()
        _emit(args, [{"dir": s.dir, **s.info} for s in found],
              lambda: tables.sessions(found) if found else "no raylite session is running")
        return 0
    session = find_session(args.session)
    if args.command == "status":
        st = session.request("status")
        _emit(args, st, lambda: tables.status(st))
    elif args.command == "list":
        if args.limit < 0:
            raise SessionError(f"--limit must be >= 0, got --limit {args.limit}", "ValueError")
        rows = session.request("list", what=args.what, filters=_filters(args.filter), limit=args.limit,
                               detail=args.detail)
        columns = _columns(args.what, args.detail)
        _emit(args, [{c: r.get(c) for c in columns} for r in rows],
              lambda: tables.listing(args.what.capitalize(), rows, columns))
    elif args.command == "summary":
        data = session.request("summary", what=args.what)
        _emit(args, data, lambda: tables.summary(args.what, data))
    elif args.command == "timeline":
        trace = session.request("timeline")
        path = args.output or f"timeline-{session.id}.json"
        with open(path, "w") as f:
            json.dump(trace, f)
        _emit(args, {"path": os.path.abspath(path), "events": len(trace)},
              lambda: f"Trace file written to {path} ({len(trace)} events): open it in chrome://tracing "
                      f"or https://ui.perfetto.dev")
    elif args.command == "logs":
        return _logs(args, session)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except SessionError as e:
        message = str(e)
        if message.startswith("no raylite session"):
            message += f" {_RAY_HINT}"
        print(f"raylite: {message}", file=sys.stderr)
        return 2 if e.kind == "ValueError" else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `raylite list tasks | head`
        return 0
    except OSError as e:
        print(f"raylite: {e}", file=sys.stderr)
        return 1
