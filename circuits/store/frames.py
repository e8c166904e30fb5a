"""``to_pandas()`` of the result objects: pandas is imported only when a table is asked for, so the package
works without it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from interventions.types import DataFrame, JsonMapping

__all__ = ["dataframe", "require_pandas"]


def require_pandas() -> Any:
    """The ``pandas`` module, or an ``ImportError`` in one line saying how to install it."""
    try:
        import pandas
    except ImportError:
        raise ImportError("to_pandas() needs pandas, which is not installed: pip install pandas") from None
    return pandas


def dataframe(rows: Iterable[JsonMapping], columns: Iterable[str] | None = None) -> DataFrame:
    """A ``pandas.DataFrame`` of ``rows`` (one dict per row), columns in ``columns`` order when given."""
    pd = require_pandas()
    rows = [dict(r) for r in rows]
    return pd.DataFrame(rows, columns=list(columns) if columns is not None else None)
