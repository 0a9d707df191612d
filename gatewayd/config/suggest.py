"""What an "unknown key" error suggests: the keys a config file may hold where the unknown one stands, nearest
first.

Owns walking a config model's fields along an error's location (through a table of tables, `[methods.NAME]`, and
a list of tables) to the table the key was found in, and choosing the known keys that look like it. Does not own
the error's text around it or its file and line (loader.py), nor which keys exist (models.py).
"""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

# Keys named in one suggestion, and how alike a key must be to be named (difflib's ratio: `protocl` and
# `protocol` 0.93, `timeout` and `call_timeout` 0.74, `env` and `cwd` 0.33).
MAX_SUGGESTIONS = 3
MIN_LIKENESS = 0.6


def nearest_keys(model: type[BaseModel], location: Sequence[int | str]) -> list[str]:
    """The keys the table at `location[:-1]` takes that look most like `location[-1]`, nearest first; none when the
    table is not a model's (a free-form table) or nothing is near."""
    if not location:
        return []
    import difflib  # only once a file is wrong: not on every start (~1 ms)

    known = _keys_at(model, list(location[:-1]))
    return difflib.get_close_matches(str(location[-1]), sorted(known or ()), MAX_SUGGESTIONS, MIN_LIKENESS)


def _keys_at(annotation: Any, location: list[int | str]) -> set[str] | None:
    """The keys of the model that `annotation` holds at `location` (a model's field names, a dict's or list's
    entries on the way), or None if there is none."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not location:
            return {field.alias or name for name, field in annotation.model_fields.items()}
        for name, field in annotation.model_fields.items():
            if location[0] in (name, field.alias):
                return _keys_at(field.annotation, location[1:])
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        found = (_keys_at(arg, location) for arg in args)
        return next((keys for keys in found if keys is not None), None)
    if location and origin in (dict, collections.abc.Mapping, list, tuple) and args:
        # A table of tables (`[methods.NAME]`) or a list of them: the next part of the location is the entry.
        return _keys_at(args[0] if origin in (list, tuple) else args[-1], location[1:])
    return None
