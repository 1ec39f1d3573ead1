"""``ray.util.debug``'s log helpers: ``log_once(key)`` is True on a key's first call only (or,
after ``enable_periodic_logging()``, again once a minute has passed since the last first call)."""
from __future__ import annotations

import time

__all__ = ["disable_log_once_globally", "enable_periodic_logging", "log_once", "reset_log_once"]

_logged: set[str] = set()
_disabled = False
_periodic = False
_last_logged = 0.0


def log_once(key: str) -> bool:
    global _last_logged
    if _disabled:
        return False
    if key not in _logged:
        _logged.add(key)
        _last_logged = time.monotonic()
        return True
    if _periodic and time.monotonic() - _last_logged > 60.0:   # Ray's period: start over
        _logged.clear()
        _last_logged = time.monotonic()
    return False


def disable_log_once_globally() -> None:
    """Make log_once() return False in this process."""
    global _disabled
    _disabled = True


def enable_periodic_logging() -> None:
    """Make log_once() return True again for a key once a minute has passed."""
    global _periodic
    _periodic = True


def reset_log_once(key: str | None = None) -> None:
    """Forget ``key`` (or every key), so its next log_once() is True."""
    if key is None:
        _logged.clear()
    else:
        _logged.discard(key)
