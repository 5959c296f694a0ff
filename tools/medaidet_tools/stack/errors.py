"""Errors of the stack installer."""
from medaidet.errors import MedaidetError


class StackError(MedaidetError):
    """Building or installing chainer/chainercv/CuPy failed; the message says why and what to do."""
