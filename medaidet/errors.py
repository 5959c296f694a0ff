"""The one base class for every error medaidet raises on purpose.

Messages name the file, object or value at fault and say how to fix it.
"""


class MedaidetError(Exception):
    """Base class of medaidet's named errors."""
