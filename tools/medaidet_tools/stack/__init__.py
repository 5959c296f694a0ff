"""Install path for chainer 7.8.1 / chainercv 0.13.1 (+ CuPy) on today's platforms.

Nothing else in medaidet imports this package, and it imports nothing of
the stack it installs: it must run before chainer exists.
"""
from medaidet_tools.stack.build import build_wheels, default_cache_dir
from medaidet_tools.stack.errors import StackError
from medaidet_tools.stack.install import StackStatus, install, status

__all__ = ["build_wheels", "default_cache_dir", "install", "status", "StackError",
           "StackStatus"]
