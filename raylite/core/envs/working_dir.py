"""runtime_env ``working_dir`` and local ``py_modules`` on the local runtime: as Ray uploads them
and unpacks them on each node, work runs in a copy, so files a task writes never land in the
user's directory, and what ``excludes``, ``.gitignore`` and ``.rayignore`` files leave out (git's
patterns) is not there. For ``working_dir``, Ray 2.60's default excludes apply too (``.git``,
``.venv``, ``venv``, ``__pycache__``; ``RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES`` replaces
them), and ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1`` ignores ``.gitignore`` files, as in Ray.

A copy is made once per session for each (kind, directory, excludes) the work asks for, before
the first worker with it starts (in a thread of the driver's: raylite.core.node.env_setup), under
``<temp dir>/raylite/session_<id>/runtime_resources`` (Ray's layout), in a folder named by a hash
of what it holds (relative paths, sizes, modification times). The zygote removes it all when the
session ends. A directory holding more than Ray's limit on a package (512 MiB, or
``RAY_max_grpc_message_size``) fails the work with RuntimeEnvSetupError, as Ray fails its upload.
"""
from __future__ import annotations

import os
import re

_DEFAULT_EXCLUDES = ".git,.venv,venv,__pycache__"
_MAX_BYTES = 512 * 2**20
_copies: dict[tuple, str] = {}   # (kind, source, excludes) -> the copy's folder, once made this session


def session_root(session: str) -> str:
    import tempfile
    return os.path.join(tempfile.gettempdir(), "raylite", f"session_{session}", "runtime_resources")


def remove_session(session: str) -> None:
    """The session's copies (the session folder too, unless it keeps logs)."""
    import shutil
    root = session_root(session)
    shutil.rmtree(root, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(root))
    except OSError:
        pass


def copy_of(kind: str, source: str, excludes: tuple) -> str:
    """The folder a worker puts on sys.path (and, for working_dir, runs in): ready, as work with
    this environment waits for its copy (raylite.core.node.env_setup)."""
    return _copies[(kind, source, excludes)]


class Copy:
    """One copy being made (in a thread of the caller's); `cancel` stops it between files."""

    def __init__(self, kind: str, source: str, excludes: tuple, root: str):
        self.kind, self.source, self.excludes, self.root = kind, source, excludes, root
        self.cancelled = False

    def run(self) -> str | None:
        """Make the copy; None when ready, else why not."""
        import shutil
        import tempfile
        try:
            entries = self._entries()
        except OSError as e:
            return f"could not read {self.kind} {self.source}: {e}"
        total, limit = sum(size for _, size, _ in entries if size is not None), _max_bytes()
        if total >= limit:
            return (f"{self.kind} {self.source} holds {_mib(total)}, more than the limit of {_mib(limit)} "
                    f"(Ray's, for what it uploads): leave large files out with runtime_env['excludes'] "
                    f"or a .gitignore or .rayignore file")
        import hashlib  # here: its OpenSSL costs the driver 6 ms and 4 MB at init otherwise
        digest = hashlib.sha256("\0".join([self.kind, self.source] + [f"{r}\0{s}\0{m}" for r, s, m in entries])
                                .encode()).hexdigest()[:16]
        dest = os.path.join(self.root, f"{self.kind}_files", f"_raylite_pkg_{digest}")
        base = self.source if self.kind == "working_dir" else os.path.dirname(self.source)
        tmp = None
        try:
            if not os.path.isdir(dest):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                tmp = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".tmp-", dir=os.path.dirname(dest))
                for rel, size, _ in entries:
                    if self.cancelled:
                        return "cancelled: the runtime shut down"
                    if size is None:
                        os.makedirs(os.path.join(tmp, rel), exist_ok=True)
                    else:
                        shutil.copy2(os.path.join(base, rel), os.path.join(tmp, rel))
                try:
                    os.rename(tmp, dest)
                except OSError:   # the same files, copied meanwhile for other excludes that left out nothing
                    if not os.path.isdir(dest):
                        raise
        except OSError as e:
            return f"could not copy {self.kind} {self.source} to {dest}: {e}"
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        _copies[(self.kind, self.source, self.excludes)] = dest
        return None

    def cancel(self) -> None:
        self.cancelled = True

    def _entries(self) -> list[tuple[str, int | None, int | None]]:
        """(path in the copy, size, mtime in ns) of each file to copy; size None: a folder. A
        py_modules package keeps its own name in the copy, whose folder goes on sys.path."""
        if os.path.isfile(self.source):   # a single-file module
            st = os.stat(self.source)
            return [(os.path.basename(self.source), st.st_size, st.st_mtime_ns)]
        defaults = os.environ.get("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", _DEFAULT_EXCLUDES) \
            if self.kind == "working_dir" else ""
        patterns = [p.strip() for p in defaults.split(",") if p.strip()] + list(self.excludes)
        prefix = "" if self.kind == "working_dir" else os.path.basename(self.source) + "/"
        out = [(prefix, None, None)] if prefix else []
        _walk(self.source, "", prefix, [("", _rules(patterns))], out, set())
        return out


def _walk(directory: str, rel: str, prefix: str, specs: list, out: list, seen: set) -> None:
    """Add what `directory` (`rel` below the source) holds that no ignore rule leaves out;
    each .gitignore and .rayignore applies below its own folder, as in git and Ray."""
    real = os.path.realpath(directory)
    if real in seen:   # a symbolic link back up the tree
        return
    seen.add(real)
    names = (".gitignore", ".rayignore") if os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1" \
        else (".rayignore",)
    for name in names:
        try:
            with open(os.path.join(directory, name)) as f:
                specs = specs + [(rel, _rules(f))]
        except OSError:
            pass
    with os.scandir(directory) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        path = rel + entry.name
        is_dir = entry.is_dir()
        if any(_ignored(rules, path[len(base):], is_dir) for base, rules in specs):
            continue
        if is_dir:
            out.append((prefix + path, None, None))
            _walk(entry.path, path + "/", prefix, specs, out, seen)
        else:
            st = entry.stat()
            out.append((prefix + path, st.st_size, st.st_mtime_ns))


def _ignored(rules: list, path: str, is_dir: bool) -> bool:
    """Whether the last rule that matches `path` (relative to the rules' folder) leaves it out."""
    verdict = False
    for regex, negated, dir_only in rules:
        if regex.match(path + "/" if dir_only and is_dir else path):
            verdict = not negated
    return verdict


def _rules(lines) -> list[tuple[re.Pattern, bool, bool]]:
    """gitignore lines (git's wildmatch, as Ray reads them) as (regex, negated, folders only)."""
    rules = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line.strip() or line.startswith("#"):
            continue
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        negated = line.startswith("!")
        line = line[1:] if negated or line.startswith(("\\!", "\\#")) else line
        dir_only = line.endswith("/")
        body = line.rstrip("/")
        if not body:
            continue
        anchored = "/" in body   # a slash before the end: relative to the folder, else at any depth
        segments = body.lstrip("/").split("/")
        regex = "" if anchored else "(?:.*/)?"
        for i, segment in enumerate(segments):
            last = i == len(segments) - 1
            if segment == "**":
                regex += ".*" if last else "(?:.*/)?"
            else:
                regex += _glob(segment) + ("" if last else "/")
        rules.append((re.compile(regex + ("/.*" if dir_only else "(?:/.*)?") + r"\Z", re.S), negated, dir_only))
    return rules


def _glob(segment: str) -> str:
    out, i = "", 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "\\" and i + 1 < len(segment):
            i += 1
            out += re.escape(segment[i])
        elif c == "[" and (end := _class_end(segment, i)) != -1:
            body = segment[i + 1:end]
            negate = body[0] in "!^"
            body = body[1:] if negate else body
            out += "[" + ("^" if negate else "") + body.replace("\\", "\\\\").replace("[", "\\[") + "]"
            i = end
        else:
            out += re.escape(c)
        i += 1
    return out


def _class_end(segment: str, start: int) -> int:
    """Where the character class opened at `start` ends (a "]" first in it is a member), or -1."""
    i = start + 1
    if i < len(segment) and segment[i] in "!^":
        i += 1
    return segment.find("]", i + 1)


def _max_bytes() -> int:
    try:
        return int(os.environ.get("RAY_max_grpc_message_size", _MAX_BYTES))
    except ValueError:
        return _MAX_BYTES


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
