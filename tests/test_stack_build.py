"""The stack installer builds correct, reproducible wheels from the pinned sdists."""
import base64
import hashlib
import zipfile

import pytest

from medaidet.stack import build_wheels, sources
from medaidet.stack.errors import StackError
from medaidet.stack.patches import Replace, RegexReplace


@pytest.fixture(scope="module")
def fresh_wheels(tmp_path_factory):
    """Both wheels built from scratch: empty cache, sdists fetched through pip."""
    cache = tmp_path_factory.mktemp("stack-cache")
    return cache, build_wheels(cache_dir=cache, log=lambda *_: None)


def _read(wheel):
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_wheels_are_named_with_our_local_label(fresh_wheels):
    _, wheels = fresh_wheels
    names = [w.name for w in wheels]
    assert names == [f"chainer-7.8.1+{sources.LOCAL_LABEL}-py3-none-any.whl",
                     f"chainercv-0.13.1+{sources.LOCAL_LABEL}-py3-none-any.whl"]


def test_wheels_are_pure_python_with_a_valid_record(fresh_wheels):
    for wheel in fresh_wheels[1]:
        files = _read(wheel)
        assert not [n for n in files if n.endswith((".c", ".so", ".pyx", ".pyd"))]
        record_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
        rows = files[record_name].decode().splitlines()
        assert len(rows) == len(files)
        for row in rows:
            name, digest, size = row.rsplit(",", 2)
            if name == record_name:
                continue
            data = files[name]
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode(), name
            assert int(size) == len(data), name


def test_metadata_and_patch_notes(fresh_wheels):
    chainer_whl, chainercv_whl = fresh_wheels[1]
    meta = _read(chainer_whl)[f"chainer-{sources.CHAINER.wheel_version}.dist-info/METADATA"]
    meta = meta.decode()
    assert f"Version: {sources.CHAINER.wheel_version}" in meta
    assert "Requires-Dist: numpy>=1.26,<2.6" in meta
    assert "setuptools" not in meta
    notes = _read(chainercv_whl)[
        f"chainercv-{sources.CHAINERCV.wheel_version}.dist-info/MEDAIDET_PATCHES"].decode()
    assert "chainercv/utils/bbox/_nms_gpu_post.py" in notes


def test_no_removed_api_left_in_code(fresh_wheels):
    """Nothing the patches target survives in executable code of either wheel."""
    for wheel in fresh_wheels[1]:
        for name, data in _read(wheel).items():
            if not name.endswith(".py"):
                continue
            code = "\n".join(line for line in data.decode().splitlines()
                             if not line.lstrip().startswith(("#", ">>>", "...")))
            assert "import pkg_resources" not in code, name
            assert "numpy.distutils.system_info\n" not in code or "try:" in code, name
            assert "np.sctypes" not in code, name
            assert "from distutils" not in code, name
            for alias in ("np.bool)", "np.int)", "np.float)", "np.object)",
                          "dtype=np.bool", "dtype=numpy.float)"):
                assert alias not in code, (name, alias)


def test_build_is_reproducible_and_cached(fresh_wheels):
    cache, wheels = fresh_wheels
    before = [w.read_bytes() for w in wheels]
    mtimes = [w.stat().st_mtime_ns for w in wheels]
    assert build_wheels(cache_dir=cache) == wheels  # cached: nothing rebuilt
    assert [w.stat().st_mtime_ns for w in wheels] == mtimes
    rebuilt = build_wheels(cache_dir=cache, force=True, log=lambda *_: None)
    assert [w.read_bytes() for w in rebuilt] == before


def test_corrupted_sdist_is_refused_with_its_name(fresh_wheels, tmp_path):
    cache, _ = fresh_wheels
    bad_cache = tmp_path / "cache"
    (bad_cache / "sdists").mkdir(parents=True)
    good = cache / "sdists" / sources.CHAINER.filename
    data = bytearray(good.read_bytes())
    data[100] ^= 0xFF
    (bad_cache / "sdists" / sources.CHAINER.filename).write_bytes(bytes(data))
    with pytest.raises(StackError, match=r"chainer-7\.8\.1\.tar\.gz: sha256 .* does not match"):
        build_wheels(cache_dir=bad_cache, log=lambda *_: None)


def test_replace_refuses_a_source_that_is_not_the_pinned_one(tmp_path):
    (tmp_path / "m.py").write_text("import pkg_resources\n")
    patch = Replace("m.py", "import other\n", "", "test")
    with pytest.raises(StackError, match="expected 1 match"):
        patch.apply(tmp_path)


def test_alias_regex_leaves_numpy_scalar_types_alone(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("a = np.bool_\nb = np.int32\nc = np.zeros(3, dtype=np.bool)\n"
                              "d = np.float\ne = np.object_\nf = np.int(3)\n")
    from medaidet.stack.patches import CHAINERCV_PATCHES
    alias = next(p for p in CHAINERCV_PATCHES if isinstance(p, RegexReplace))
    RegexReplace("pkg", alias.pattern, alias.repl, "test", min_count=3).apply(tmp_path)
    assert (pkg / "a.py").read_text() == ("a = np.bool_\nb = np.int32\n"
                                          "c = np.zeros(3, dtype=bool)\nd = float\n"
                                          "e = np.object_\nf = int(3)\n")
