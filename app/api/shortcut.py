"""Shortcuts that give up to the models: the one protocol of the hot paths' decoders.

A few inputs arrive once per message on the broker's busiest paths: a publish body, a
publish-batch body, the ``ACK`` frame a consumer sends per delivery. Building pydantic models
for them was most of their cost (docs/performance.md), so each has two forms:

- ``fast(raw)``: the result for the common, valid form of the input, made without the
  models; ``None`` when it is not sure. It never raises and never refuses anything.
- ``model(raw)``: the models' result, or their error. The rules keep this one home.

``decode`` is the two together. A caller that has a slower way to run the models (the hot
HTTP edge hands a request it is not sure of to the FastAPI route, which decodes it again)
calls ``fast`` alone. Where ``fast`` answers, both forms give the same result; where the
models refuse, ``fast`` gives up, so the error is the models'. tests/unit/test_fast_decoders.py
proves this for every decoder made here (``FastDecoder.ALL``) on generated input — valid,
nearly valid and invalid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

In = TypeVar("In")
T = TypeVar("T")


class FastDecoder(Generic[In, T]):
    """A decoder in two forms (the module's docstring): ``fast`` and ``model``."""

    __slots__ = ("fast", "model", "name")

    #: every decoder made, in order (the property test covers each one)
    ALL: ClassVar[list[FastDecoder[Any, Any]]] = []

    def __init__(self, name: str, fast: Callable[[In], T | None], model: Callable[[In], T]) -> None:
        self.name = name
        self.fast = fast
        self.model = model
        FastDecoder.ALL.append(self)

    def decode(self, raw: In) -> T:
        """``fast(raw)``, or the models' result (or error) when it gives up."""
        result = self.fast(raw)
        return self.model(raw) if result is None else result

    def __repr__(self) -> str:
        return f"FastDecoder({self.name!r})"
