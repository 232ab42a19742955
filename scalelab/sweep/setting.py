"""One setting of a sweep: what scalelab.sweep.settings declares of each (its SETTINGS table).

Planned marks what a store from before a setting reads as where resume takes the plan's value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class Planned:
    """A store from before the setting was recorded ran it as the plan says now (resume
    compares it so); read alone, such a record holds `value`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Planned({self.value!r})"


@dataclass(frozen=True)
class Setting:
    """One setting of a sweep (see the module doc)."""

    key: str  # the sweep-file key; the bench option is --key-with-dashes (or --cli)
    field: str  # the SweepSpec attribute
    type: Any  # its annotation
    parse: Callable[[Any, str], Any]  # (value, label naming where it came from) -> value
    default: Any  # a list default is copied per spec
    help: str  # what it is: invoke bench --help, and the store contract's params table
    bench: bool = True  # an option of invoke bench (False: a key of sweep files only)
    cli: str | None = None  # the bench option where it is not the key ("timeout")
    switch: bool | None = None  # a bench switch with this default (True: --no-x turns it off)
    # a variant axis: every value is planned as its own train runs, the product in table order
    variant: bool = False
    engines: tuple[str, ...] = ()  # a variant only these engines have: others record None
    # a variant only the combinations of the axes before it that pass this have (others None)
    applies: Callable[[Mapping[str, Any]], bool] | None = None
    # where applies is false, the run records the axis's first value rather than None (an
    # axis that was a lone setting before, so stores from then resume unchanged)
    unapplied_first: bool = False
    single: Any = None  # the value planned when a variant is not given
    tag: Callable[[Any], str] | None = None  # a variant value's run-id segment
    # tag a lone value too where it is not `single` (run ids of the defaults stay unchanged)
    tag_lone: bool = False
    series: bool = True  # a variant value that is not `before` names its own series
    record: str | None = None  # the runs.jsonl params key (None: not recorded per run)
    to_record: Callable[[Any], Any] | None = None  # the spec value -> the recorded one
    column: str | None = None  # its results.csv column (the record key's value)
    since: int = 1  # the store version that first recorded it
    # what a store older than `since` reads as: a value, a function of the other params, or
    # Planned (resume takes the plan's)
    before: Any = None
    alias_of: str | None = None  # a key that sets another key's field (never written back)
    # the static check of a spec this setting asks for (InputError), run when the spec is
    # built, before any cluster is looked at (check_spec)
    check: Callable[[Any], None] | None = None

    @property
    def numeric(self) -> bool:
        """Whether its values are numbers (a results.csv column of numbers, NaN for none)."""
        return any(t in str(self.type) for t in ("int", "float"))

    @property
    def option(self) -> str:
        """The bench option's name (a Python identifier, as invoke takes it)."""
        return self.cli or self.key

    def planned_values(self, spec: Any) -> list[Any]:
        """A variant's values in a sweep of spec ([None] where its engine lacks it)."""
        if self.engines and spec.engine not in self.engines:
            return [None]
        return list(getattr(spec, self.field) or [self.single])

    def recorded(self, value: Any) -> Any:
        return self.to_record(value) if self.to_record else value

    def old_value(self, params: Mapping[str, Any]) -> Any:
        """What a record from before this setting holds for it."""
        if isinstance(self.before, Planned):
            return self.before.value
        return self.before(params) if callable(self.before) else self.before
