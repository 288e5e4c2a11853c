"""A typed registry of pluggable parts (policies, runners) by name.  Duplicates are rejected."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories of one kind of part; ``names()`` feeds CLI and config choices."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: ``@POLICIES.register("fcfs-rr")`` on a class or factory function."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = factory
            return factory

        return add

    def create(self, name: str, **kwargs: object) -> T:
        return self.factory(name)(**kwargs)

    def factory(self, name: str) -> Callable[..., T]:
        """The factory registered as ``name``; ValueError naming the choices if none is."""
        try:
            return self._factories[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
