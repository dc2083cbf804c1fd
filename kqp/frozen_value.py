"""The base of the frozen dataclasses in kqp's compiled modules: pickled as a call to their
constructor, so that both builds pickle them alike.

Spark ships the quota settings to its Python workers with pickle. mypyc's default pickling of a
compiled class sets each field again with setattr after creating the object, which a frozen
dataclass refuses (FrozenInstanceError on its first field), so whatif and advise failed on the
compiled build. Reduced to `(class, field values)`, an instance is rebuilt by its own
`__init__`, which both the compiled and the interpreted class accept.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, cast


class FrozenValue:
    """Subclassed by a frozen dataclass whose fields are its constructor's positional parameters,
    in order (none keyword-only, none left out of `__init__`: tests/unit/test_pickling.py
    round-trips each such class in both builds)."""

    # A compiled class has compiled subclasses only: this module is compiled with them.
    __slots__ = ()

    def __reduce__(self) -> tuple[type[FrozenValue], tuple[object, ...]]:
        # Typed as Any for `fields`: its stubs name the dataclass protocol in `_typeshed`, a
        # module that exists only for type checkers, and kqp imports nothing that is not
        # installed (tests/packaging/test_spark_extra.py reads every import, TYPE_CHECKING ones too).
        values = tuple(getattr(self, field.name) for field in fields(cast(Any, self)))
        return type(self), values
