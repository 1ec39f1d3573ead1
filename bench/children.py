"""Running one measured side in a fresh child process, for the bench scripts (core.py, peers.py).

The child is `python SCRIPT --_child NAME RESULTS_PATH ...` in its own session, so what it leaves
running can be killed as a group; it streams one JSON line per figure into RESULTS_PATH, and a crash
or a timeout keeps the figures it wrote so far.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile


def run_child(script: str, name: str, extra: list, figure_keys, timeout: float, verbose: bool) -> dict:
    """{figure key: value, or "error: ..."} from one child run of `script` measuring `name`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    env.pop("PYTHONDONTWRITEBYTECODE", None)   # measure with bytecode caching, as a normal install has
    with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
        res_path, log_path = os.path.join(tmp, "results.jsonl"), os.path.join(tmp, "child.log")
        cmd = [sys.executable, os.path.abspath(script), "--_child", name, res_path, *map(str, extra)]
        with open(log_path, "w") as log:
            sink = None if verbose else log
            p = subprocess.Popen(cmd, cwd=root, env=env, stdout=sink, stderr=sink, start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = f"timed out after {timeout:g} s"
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the child's own process group: leftover workers
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
        results = {}
        if os.path.exists(res_path):
            with open(res_path) as f:
                for line in f:
                    r = json.loads(line)
                    results[r["key"]] = f"error: {r['error']}" if r["error"] else r["value"]
        if rc != 0:
            print(f"[{name}] child exited: {rc}", file=sys.stderr)
            if not verbose:
                with open(log_path) as f:
                    sys.stderr.write("".join(f.readlines()[-30:]))
            for k in figure_keys:
                results.setdefault(k, f"error: not measured (child {rc})")
        return results
