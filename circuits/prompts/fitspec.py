"""How a fit set is drawn (:class:`FitSpec`): a value of the prompt spec, importable without torch (the command
line's flags are declared on its fields). The fit set itself is :mod:`circuits.prompts.fitset`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError
from circuits.flags import flag
from circuits.vocab import FIT_MIN_COUNT, FIT_SIZE, POPULATIONS

if TYPE_CHECKING:
    from interventions.types import JsonDict

__all__ = ["DEFAULT_MIN_COUNT", "DEFAULT_SIZE", "FitSpec"]

DEFAULT_SIZE = FIT_SIZE
"""Default :attr:`FitSpec.size` (:data:`circuits.vocab.FIT_SIZE`)."""
DEFAULT_MIN_COUNT = FIT_MIN_COUNT
"""Default :attr:`FitSpec.min_count` (:data:`circuits.vocab.FIT_MIN_COUNT`)."""
def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class FitSpec:
    """How the fit set is drawn (see the module docstring): ``size`` (prompts, >= 1), ``min_count`` (fit
    prompts per needed entry, >= 1), ``seed`` (order of the operand space) and ``population``."""

    size: int = field(default=DEFAULT_SIZE, metadata=flag(
        "prompts the means are fitted on, never the scored ones: the task's whole layout when it has at most this "
        "many, else a sample topped up to --fit-min-count"))
    min_count: int = field(default=DEFAULT_MIN_COUNT, metadata=flag("fit prompts each CAMA mean needs at the least"))
    seed: int = field(default=0, metadata=flag("order in which fit prompts are drawn"))
    population: str = field(default="all", metadata=flag(
        "average over all task prompts (the CAMA formula) or only those the model answers correctly",
        choices=POPULATIONS))

    def validate(self) -> FitSpec:
        """Raise :class:`~circuits.errors.ArgumentError` naming the first bad field."""
        for name, lo in (("size", 1), ("min_count", 1), ("seed", 0)):
            value = getattr(self, name)
            if not is_int(value) or value < lo:
                raise ArgumentError(f"fit {name}={value!r} must be an integer >= {lo} (--fit-{name.replace('_', '-')})")
        if self.population not in POPULATIONS:
            raise ArgumentError(f"fit population={self.population!r} is not valid: choose one of "
                                f"{', '.join(POPULATIONS)} (--fit-population)")
        return self

    def identity(self) -> JsonDict:
        return {"size": int(self.size), "min_count": int(self.min_count), "seed": int(self.seed),
                "population": self.population}
