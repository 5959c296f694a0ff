# Added by medaidet's chainer build: requirement checks without pkg_resources
# (removed from setuptools >= 82), for chainer.testing and _environment_check.
import importlib.metadata


def installed_version(name):
    """Version string of the installed distribution ``name``, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def satisfied(*requirements):
    """True when every PEP 508 requirement string is met by what is installed."""
    from packaging.requirements import Requirement

    for text in requirements:
        requirement = Requirement(text)
        version = installed_version(requirement.name)
        if version is None:
            return False
        if not requirement.specifier.contains(version, prereleases=True):
            return False
    return True
