# Replaced by medaidet's chainer build. Upstream imported pkg_resources
# (removed from setuptools >= 82) and numpy.distutils (gone on Python 3.12 and
# NumPy 2) at import time; this version uses importlib.metadata and looks at
# NumPy's BLAS only on macOS, the one place the check matters.
import os
import sys
import warnings

import chainer
from chainer import _requirements


def _check_python_350():
    if sys.version_info[:3] == (3, 5, 0):
        if not int(os.getenv('CHAINER_PYTHON_350_FORCE', '0')):
            raise Exception('Chainer does not work with Python 3.5.0.')


def _check_osx_numpy_backend():
    if sys.platform != 'darwin':
        return
    try:
        import numpy.distutils.system_info as system_info
    except ImportError:  # NumPy 2 / Python 3.12 have no numpy.distutils
        return
    blas_opt_info = system_info.get_info('blas_opt')
    extra_link_args = (blas_opt_info or {}).get('extra_link_args')
    if extra_link_args and '-Wl,Accelerate' in extra_link_args:
        warnings.warn('Accelerate has been detected as a NumPy backend library; '
                      'vecLib is known not to work correctly with Chainer. '
                      'Use NumPy built with OpenBLAS instead.')


def _check_optional_dependencies():
    check_versions = os.environ.get('CHAINER_WARN_VERSION_MISMATCH', '1') == '1'
    for dep in chainer._version._optional_dependencies:
        name, spec = dep['name'], dep['specifier']
        found = [pkg for pkg in dep['packages']
                 if _requirements.installed_version(pkg) is not None]
        if len(found) > 1:
            warnings.warn(
                'Multiple installations of {} have been detected: {}. Keep exactly '
                'one: pip uninstall all of them, then install the one you need '
                '(`medaidet doctor` tells which).'.format(name, ', '.join(found)))
        for pkg in found:
            if check_versions and not _requirements.satisfied(pkg + spec):
                warnings.warn(
                    '{} ({}) version {} may not be compatible with this version of '
                    'Chainer (supported: {}). See {}'.format(
                        name, pkg, _requirements.installed_version(pkg), spec,
                        dep['help']))


def check():
    _check_python_350()
    _check_osx_numpy_backend()
    _check_optional_dependencies()
