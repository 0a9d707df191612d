"""Value records: dataclasses frozen to the type checker and plain, slotted ones at run time.

Owns `value`, the decorator for the records made on every call's path: a parsed message and its body, its target,
how it is delivered, its caller. A frozen dataclass's `__init__` sets each field through `object.__setattr__`;
a `Delivery` (13 fields) took ~1.45 µs to make that way against ~0.49 slotted, and the four such records a call
makes ~1.6 µs more than slotted ones (timeit, 2026-12-04). Nothing may change them once made — some are shared, such
as `upstream.api.ANYONE` — and mypy (strict, part of `make test`) refuses any assignment to their fields, where a
frozen dataclass only refused it at run time. They compare and hash by value, as frozen ones do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True, slots=True)` as the type checker sees it; at run time the same class unfrozen."""
    # unsafe_hash gives the field-wise __hash__ a frozen dataclass has: safe here, as nothing changes the fields.
    return dataclass(slots=True, unsafe_hash=True)(cls)
