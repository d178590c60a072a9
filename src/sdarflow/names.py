"""Things chosen by name (methods, aggregation modes, retrieval strategies, engines, envs, stages): a config string
is a key, bound once to an object (:meth:`NameRegistry.register`) or to a ``"module:attribute"`` path imported on
first use (:meth:`NameRegistry.add_lazy`, for heavy dependencies). A failed look-up names the valid choices."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from sdarflow.errors import ConfigError

T = TypeVar("T")


class UnknownNameError(ConfigError, ValueError):
    def __init__(self, kind: str, name: str, valid: tuple[str, ...]) -> None:
        super().__init__(f"unknown {kind} {name!r}; fix: choose one of {', '.join(valid)}")


class NameRegistry(Generic[T]):
    """A write-once mapping from names to objects (or to import paths, resolved on first use)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T | str] = {}
        self._lazy: set[str] = set()

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator binding ``name``; binding a name twice is a programming error (``ValueError``)."""

        def bind(obj: T) -> T:
            self._bind(name, obj)
            return obj

        return bind

    def add_lazy(self, name: str, path: str) -> None:
        """Bind ``name`` to ``"package.module:attribute"`` (or a module, without ``:``), imported by :meth:`get`."""
        self._bind(name, path)
        self._lazy.add(name)

    def _bind(self, name: str, obj: T | str) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered to {self._items[name]!r}")
        self._items[name] = obj

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UnknownNameError(self.kind, name, self.names())
        if name in self._lazy:
            module, _, attr = str(self._items[name]).partition(":")
            loaded = importlib.import_module(module)
            self._items[name] = getattr(loaded, attr) if attr else loaded
            self._lazy.discard(name)
        return self._items[name]  # type: ignore[return-value]

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
