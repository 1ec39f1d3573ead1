"""Arguments checked against the remote function's signature at ``.remote()``, as Ray does, so a
missing or extra argument is a TypeError in the caller instead of a failed task later.

A signature is boiled down once (when the function or class is decorated) to a small plain tuple,
which travels inside actor handles. A call without keyword arguments then costs two integer
comparisons; the full check runs only for keyword arguments or a call that looks wrong. Also
what a definition is (a coroutine, a generator, an async actor class), for the driver and the
worker alike.
"""
from __future__ import annotations

import inspect

_ANY = 1 << 30   # no upper bound: the function takes *args


def arity(fn, drop_first: bool = False) -> tuple | None:
    """(min positional, max positional, positional names, keyword-only names, required
    keyword-only names, takes **kwargs), or None when Python cannot tell (some builtins).
    `drop_first`: a method's `self`."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if drop_first and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword_only = [p for p in params if p.kind == p.KEYWORD_ONLY]
    required = sum(1 for p in positional if p.default is p.empty)
    most = _ANY if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
    # positional-only names cannot be given by keyword: marked with a leading "/"
    names = tuple(("/" if p.kind == p.POSITIONAL_ONLY else "") + p.name for p in positional)
    return (required, most, names, tuple(p.name for p in keyword_only),
            tuple(p.name for p in keyword_only if p.default is p.empty),
            any(p.kind == p.VAR_KEYWORD for p in params))


def method_arity(cls, name: str) -> tuple | None:
    """A method's arity as its callers see it (without `self`; static and class methods as they are)."""
    static = inspect.getattr_static(cls, name, None)
    bound = isinstance(static, (staticmethod, classmethod))
    return arity(getattr(cls, name), drop_first=not bound)


def check(shape: tuple | None, args: tuple, kwargs: dict, what: str) -> None:
    """Raise TypeError (inspect's wording, naming `what`) if the call cannot bind."""
    if shape is None or (not kwargs and shape[0] <= len(args) <= shape[1] and not shape[4]):
        return
    problem = _problem(shape, args, kwargs)
    if problem is not None:
        raise TypeError(f"{what}.remote(): {problem}")


def _problem(shape: tuple, args: tuple, kwargs: dict) -> str | None:
    required, most, names, keyword_only, required_keyword_only, any_keyword = shape
    if len(args) > most:
        return "too many positional arguments"
    by_keyword = {n for n in names if not n.startswith("/")} | set(keyword_only)
    bound = {n for n in names[:len(args)]}
    for key in kwargs:
        if key in bound:
            return f"multiple values for argument {key!r}"
        if key not in by_keyword and not any_keyword:
            if "/" + key in names:
                return f"{key!r} parameter is positional only, but was passed as a keyword"
            return f"got an unexpected keyword argument {key!r}"
    missing = [n.lstrip("/") for n in names[len(args):required] if n.startswith("/") or n not in kwargs]
    missing += [n for n in required_keyword_only if n not in kwargs]
    return f"missing a required argument: {missing[0]!r}" if missing else None


# what a definition is, from its code flags: CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR
_GENERATOR_FLAGS, _ASYNC_FLAGS = 0x20 | 0x200, 0x80 | 0x200


def _code_flags(fn) -> int:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code.co_flags if code is not None else 0


def is_coroutine_function(fn) -> bool:
    return bool(_code_flags(fn) & 0x80)


def has_async_methods(cls) -> bool:
    """Whether an actor class is async (any async def or async generator method): its calls then
    share one event loop, in the driver's spec and in the worker alike."""
    return any(_code_flags(getattr(cls, name, None)) & _ASYNC_FLAGS for name in dir(cls))


def default_returns(fn):
    """Ray streams what a generator function yields unless told otherwise."""
    return "streaming" if _code_flags(fn) & _GENERATOR_FLAGS else 1
