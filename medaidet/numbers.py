"""Numbers in results: a float that is nan or inf has no JSON form, so results say None."""
import math
import numbers


def finite_or_none(value):
    """``float(value)``, or None when it is nan or inf (or ``value`` is None)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def is_real(value) -> bool:
    """A real number (Python's or NumPy's), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
