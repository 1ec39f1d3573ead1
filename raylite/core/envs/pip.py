"""runtime_env ``pip`` and ``uv`` on the local runtime: the packages installed once per requirement
list, in a virtual environment the workers of such tasks and actors import from first. ``uv``
uses the uv command where it is on PATH (else pip); uv does not read the ``.pth`` file below, so
it installs the whole dependency closure, as into a fresh uv venv.

The environment lives under the cache directory (``RAYLITE_RUNTIME_ENV_DIR``, else
``~/.cache/raylite/runtime_envs``) and is reused by later sessions, as Ray keeps one per node. It
sees this Python's own packages (a ``.pth`` file in it names their directories), so the installer
adds only what is missing or pinned to another version, and never changes this Python's packages:
one found outside the environment is shadowed there, not uninstalled. It is built in a temporary
directory and renamed into place when complete, so a failed or interrupted install leaves nothing
that a later session would take for ready; two drivers installing the same list at once both
succeed, and one copy is kept.
"""
from __future__ import annotations

import os
import sys  # (the rest is imported where it is used: every worker imports this module)

CACHE_ENV = "RAYLITE_RUNTIME_ENV_DIR"
_OUTPUT_TAIL = 2000   # characters of the installer's output an error shows


def requirements(field: str, value, where: str) -> tuple[str, ...]:
    """Ray's forms of the field as a tuple of requirement strings: a list of requirements, a
    requirements file's path, or a dict with "packages" (either of those; its other keys, such
    as pip_version, are accepted and not applied)."""
    what = f"{where}: runtime_env[{field!r}]"
    if isinstance(value, dict):
        if "packages" not in value:
            raise ValueError(f"{what} as a dict needs 'packages' (a list of requirements or a requirements "
                             f"file), got keys {sorted(value)}")
        value = value["packages"]
        what += "['packages']"
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        try:
            with open(path) as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
        except OSError as e:
            raise ValueError(f"{what}={path!r} is neither a list of requirements nor a readable requirements "
                             f"file: {e.strerror}") from None
        value = [line for line in lines if line]
    if not isinstance(value, (list, tuple)) or not all(isinstance(r, str) and r.strip() for r in value):
        raise TypeError(f"{what} must be a list of requirement strings (e.g. ['requests==2.31']), got {value!r}")
    # local paths (a wheel, a project directory) made absolute: the same environment from any cwd
    return tuple(os.path.abspath(r.strip()) if os.path.exists(r.strip()) else r.strip() for r in value)


def cache_root() -> str:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "raylite", "runtime_envs")


def env_dir(field: str, reqs: tuple[str, ...]) -> str:
    """Where this requirement list's environment lives: one per list, installer and base Python."""
    import hashlib
    key = "\n".join((field, sys.prefix, sys.version, *reqs))
    return os.path.join(cache_root(), f"{field}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def site_dir(path: str) -> str:
    return os.path.join(path, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")


def ready(path: str) -> bool:
    return os.path.isdir(site_dir(path))


class Install:
    """One environment being built (in a thread of the caller's); `cancel` stops the installer."""

    def __init__(self, field: str, reqs: tuple[str, ...], timeout_s: float | None):
        self.field, self.reqs, self.timeout_s = field, reqs, timeout_s
        self.path = env_dir(field, reqs)
        self.proc = None   # the installer's subprocess.Popen
        self.cancelled = False

    def run(self) -> str | None:
        """Build the environment; None when ready, else why not (with the installer's output)."""
        import shutil
        import tempfile
        if ready(self.path):
            return None
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=os.path.basename(self.path) + ".tmp-", dir=os.path.dirname(self.path))
        try:
            why = self._build(tmp)
            if why is None:
                try:
                    os.rename(tmp, self.path)
                except OSError:   # another driver finished the same environment first
                    if not ready(self.path):
                        raise
            return why
        except OSError as e:
            return f"could not create the environment in {self.path}: {e}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _build(self, tmp: str) -> str | None:
        python = os.path.join(tmp, "bin", "python")
        made = self._exec([sys.executable, "-m", "venv", "--without-pip", tmp], "creating a virtual environment")
        if made:
            return made
        with open(os.path.join(site_dir(tmp), "_raylite_base.pth"), "w") as f:
            f.write("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))) + "\n")
        import shutil
        uv = shutil.which("uv") if self.field == "uv" else None
        if uv is not None:
            command = [uv, "pip", "install", "--python", python, *self.reqs]
        else:   # this Python's pip, run by the environment's interpreter, installs into the environment
            command = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *self.reqs]
        return self._exec(command, f"`{self.field} install {' '.join(self.reqs)}`")

    def _exec(self, command: list[str], what: str) -> str | None:
        import subprocess
        if self.cancelled:
            return "cancelled: the runtime shut down"
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace",
                                     start_new_session=True)   # its own group: _kill reaches what it starts
        try:
            output, _ = self.proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            output, _ = self.proc.communicate()
            return (f"{what} took longer than setup_timeout_seconds={self.timeout_s:g}:\n"
                    f"{output[-_OUTPUT_TAIL:].rstrip()}")
        if self.proc.returncode != 0:
            if self.cancelled:
                return "cancelled: the runtime shut down"
            return (f"{what} failed (exit code {self.proc.returncode}):\n{output[-_OUTPUT_TAIL:].rstrip()}")
        return None

    def cancel(self) -> None:
        self.cancelled = True
        self._kill()

    def _kill(self) -> None:
        """The installer and whatever it started (a package's build backend, say)."""
        import signal
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
