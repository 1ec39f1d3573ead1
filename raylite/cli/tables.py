"""Text output of the raylite CLI, shaped like Ray's: a header line, a stats block, a table with
upper-case column names and a row index."""
from __future__ import annotations

import datetime
import json
import time


def cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), default=str)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def table(rows: list[dict], columns: list[str]) -> str:
    """Rows as aligned columns under upper-case names, each row numbered as Ray's tables are."""
    head = ["", *(c.upper() for c in columns)]
    body = [[str(i), *(cell(row.get(c)) for c in columns)] for i, row in enumerate(rows)]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *body])


def banner(title: str) -> str:
    return f"======== {title}: {datetime.datetime.now():%Y-%m-%d %H:%M:%S} ========"


def section(title: str, body: str) -> str:
    return f"{title}\n{'-' * 40}\n{body}\n"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.2f}{unit}"
        n /= 1024
    return f"{n}"


def duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def number(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def counts(by_state: dict) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())) or "none"


def status(st: dict) -> str:
    """`raylite status`, as `ray status` lays it out."""
    res = st["resources"]
    lines = [f"======== raylite status: session {st['session']} ========",
             f"Driver: pid {st['pid']}, up {duration(st['uptime_s'])}, started "
             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st['started']))}",
             f"Command: {' '.join(st['cmdline'])}", f"Directory: {st['cwd']}"]
    if st.get("dashboard_url"):
        lines.append(f"Dashboard: {st['dashboard_url']}")
    lines += ["", "Resources", "-" * 40, "Usage:"]
    for name in sorted(res["total"], key=lambda k: (k not in ("CPU", "GPU"), k)):
        total, used = res["total"][name], res["used"].get(name, 0.0)
        if name.endswith("memory"):
            lines.append(f" {size(used)}/{size(total)} {name}")
        else:
            lines.append(f" {number(used)}/{number(total)} {name}")
        for dev in st["devices"].get(name, []):
            lines.append(f"   {name} {dev['id']}: {number(dev['used'])}/1 used")
    obj = st["objects"]
    lines += ["", f"Tasks: {counts(st['tasks'])}"
              + (f" ({st['tasks_dropped']} finished ones dropped from the record)" if st["tasks_dropped"] else ""),
              f"Actors: {counts(st['actors'])}", f"Workers: {st['workers']} processes",
              f"Objects: {obj['count']}, {size(obj['bytes'])} of {size(obj['capacity'])} object store"]
    lines += panels(st.get("panels", {}))
    return "\n".join(lines)


def panels(views: dict) -> list[str]:
    lines = []
    for view in views.get("tune", []):
        trials = counts(view.get("trial_states", {}))
        best = view.get("best")
        lines += ["", f"Tune: {view.get('name')} ({'finished' if view.get('finished') else 'running'}, "
                      f"{duration(view.get('elapsed_s', 0))}): trials {trials}"]
        if best:
            lines.append(f"  best {view.get('metric')} ({view.get('mode')}): {number(best['value'])} "
                         f"(trial {best['trial_id']})")
    for view in views.get("train", []):
        last = view.get("last_metrics") or {}
        shown = ", ".join(f"{k}={number(v)}" for k, v in list(last.items())[:6])
        lines += ["", f"Train: {view.get('name')} ({'finished' if view.get('finished') else 'running'}, "
                      f"{duration(view.get('elapsed_s', 0))}): {view.get('workers', 0)} workers, "
                      f"{view.get('reports', 0)} reports" + (f"; last: {shown}" if shown else "")]
    return lines


def summary(what: str, data: dict) -> str:
    """`raylite summary tasks|actors|objects`, as `ray summary` prints them."""
    cluster = data["cluster"]
    stats = "\n".join(f"{k}: {cell(v)}" for k, v in sorted(cluster.items()) if k not in ("summary", "summary_by"))
    rows = []
    for key, entry in cluster["summary"].items():
        row = {k: (", ".join(f"{s}: {n}" for s, n in v.items()) if isinstance(v, dict) else v)
               for k, v in entry.items()}
        rows.append({"key": key, **row} if what == "objects" else row)
    columns = list(rows[0]) if rows else []
    return "\n".join([banner(f"{what.capitalize()} Summary"), section("Stats:", stats),
                      section(f"Table (group by {cluster['summary_by']}):", table(rows, columns) if rows else "(none)")])


def listing(what: str, rows: list[dict], columns: list[str]) -> str:
    """`raylite list ...`, as `ray list` prints it."""
    return "\n".join([banner(f"List {what}"), section("Stats:", f"Total: {len(rows)}"),
                      section("Table:", table(rows, columns) if rows else "(none)")])


def sessions(found: list) -> str:
    rows = [{"session": s.id, "pid": s.pid,
             "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.info.get("started", 0))),
             "command": " ".join(s.info.get("cmdline", []))} for s in found]
    return table(rows, ["session", "pid", "started", "command"])
