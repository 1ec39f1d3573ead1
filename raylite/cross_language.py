"""``ray.cross_language``: Ray's Java and C++ workers. raylite runs Python workers only, so
these exist for code that names them and raise NotImplementedError, saying why, when called."""
from __future__ import annotations

import enum
from typing import NoReturn

__all__ = ["Language", "cpp_function", "java_actor_class", "java_function"]


class Language(enum.Enum):
    """The language a task or actor is written in (Ray's ``ray.Language``)."""

    PYTHON = 0
    JAVA = 1
    CPP = 2


def _python_only(what: str) -> NoReturn:
    raise NotImplementedError(f"{what}: raylite's local runtime runs Python workers only (Ray's Java and C++ "
                              "workers need a Ray cluster: init(address=...) runs this program on one)")


def java_function(class_name: str, function_name: str) -> NoReturn:
    _python_only(f"java_function({class_name!r}, {function_name!r})")


def java_actor_class(class_name: str) -> NoReturn:
    _python_only(f"java_actor_class({class_name!r})")


def cpp_function(function_name: str) -> NoReturn:
    _python_only(f"cpp_function({function_name!r})")
