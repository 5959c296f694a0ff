"""The stack installer builds correct, reproducible wheels from the pinned sdists."""
import base64
import hashlib
import zipfile

import pytest

from medaidet_tools.stack import build_wheels, sources
from medaidet_tools.stack.errors import StackError
from medaidet_tools.stack.patches import Replace, RegexReplace


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
    assert build_wheels(cache_dir=cache) == wheels
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
    from medaidet_tools.stack.patches import CHAINERCV_PATCHES
    alias = next(p for p in CHAINERCV_PATCHES if isinstance(p, RegexReplace))
    RegexReplace("pkg", alias.pattern, alias.repl, "test", min_count=3).apply(tmp_path)
    assert (pkg / "a.py").read_text() == ("a = np.bool_\nb = np.int32\n"
                                          "c = np.zeros(3, dtype=bool)\nd = float\n"
                                          "e = np.object_\nf = int(3)\n")


def _tiny_wheel(dest_dir, name="chainercv", version=None):
    """A small wheel written by write_wheel, named as the real one (no sdist, no patches)."""
    from medaidet_tools.stack.wheel import write_wheel
    version = version or {"chainer": sources.CHAINER,
                          "chainercv": sources.CHAINERCV}[name].wheel_version
    root = dest_dir.parent / f"src-{name}"
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "__init__.py").write_text("x = 1\n" * 200)
    (root / name / "core.py").write_text("def f():\n    return 2\n" * 200)
    return write_wheel(root, name=name, version=version, summary="test", packages=[(name, True)],
                       requires=[], patch_notes=["none"], dest_dir=dest_dir)


def _rewrite(wheel, change):
    """Rewrite ``wheel`` with ``change(files)``: valid zip CRCs, so only the RECORD can tell."""
    files = _read(wheel)
    change(files)
    wheel.unlink()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


def _truncate(wheel):
    wheel.write_bytes(wheel.read_bytes()[:-100])


def _flip_a_byte(wheel):
    data = bytearray(wheel.read_bytes())
    data[len(data) // 3] ^= 0xFF
    wheel.write_bytes(bytes(data))


def _change_a_module(wheel):
    _rewrite(wheel, lambda files: files.update({"chainercv/core.py": b"def f():\n    return 3\n"}))


def _drop_record(wheel):
    _rewrite(wheel, lambda files: files.pop(
        f"chainercv-{sources.CHAINERCV.wheel_version}.dist-info/RECORD"))


def _add_a_file(wheel):
    _rewrite(wheel, lambda files: files.update({"chainercv/extra.py": b"y = 2\n"}))


@pytest.mark.parametrize("damage, reason", [
    (_truncate, "not a readable zip archive"),
    (lambda w: w.write_bytes(b""), "not a readable zip archive"),
    (_flip_a_byte, "cannot be read"),
    (_change_a_module, "chainercv/core.py does not match its RECORD entry"),
    (_drop_record, "has no RECORD"),
    (_add_a_file, "chainercv/extra.py is not listed in its RECORD"),
])
def test_verify_wheel_names_what_is_broken(tmp_path, damage, reason):
    from medaidet_tools.stack.wheel import BrokenWheelError, verify_wheel
    wheel = _tiny_wheel(tmp_path / "wheels")
    damage(wheel)
    with pytest.raises(BrokenWheelError, match=reason) as info:
        verify_wheel(wheel)
    assert str(wheel) in str(info.value)


@pytest.fixture
def fake_builds(monkeypatch):
    """build_one replaced by a fast one writing a tiny wheel; the sdists it was asked for."""
    import medaidet_tools.stack.build as build_module
    built = []

    def build_one(sdist, cache_dir, log=print):
        built.append(sdist.name)
        return _tiny_wheel(cache_dir / "wheels", sdist.name)
    monkeypatch.setattr(build_module, "build_one", build_one)
    return built


def test_a_truncated_cached_wheel_is_rebuilt_not_returned(tmp_path, fake_builds):
    cache = tmp_path / "cache"
    good = _tiny_wheel(cache / "wheels", "chainer")
    broken = _tiny_wheel(cache / "wheels", "chainercv")
    _truncate(broken)
    good_bytes, good_mtime = good.read_bytes(), good.stat().st_mtime_ns
    lines = []
    wheels = build_wheels(cache_dir=cache, log=lines.append)
    assert wheels == [good, broken] and fake_builds == ["chainercv"]
    assert good.read_bytes() == good_bytes and good.stat().st_mtime_ns == good_mtime
    from medaidet_tools.stack.wheel import verify_wheel
    verify_wheel(broken)                        # what write_wheel writes is intact
    assert len(lines) == 1 and str(broken) in lines[0]
    lines.clear()
    assert build_wheels(cache_dir=cache, log=lines.append) == wheels
    assert fake_builds == ["chainercv"] and lines == []


@pytest.mark.parametrize("kind", ["file", "under a file"])
def test_dest_that_cannot_be_a_folder_fails_before_building(tmp_path, fake_builds, kind):
    from medaidet.errors import ConfigError
    blocker = tmp_path / "wheels.txt"
    blocker.write_text("mine\n")
    dest = blocker if kind == "file" else blocker / "wheels"
    with pytest.raises(ConfigError) as info:
        build_wheels(cache_dir=tmp_path / "cache", out=dest, log=lambda *_: None)
    assert info.value.kind == ("not_a_folder" if kind == "file" else "unwritable")
    assert info.value.path == dest and str(info.value).startswith("--out: ")
    assert fake_builds == [] and blocker.read_text() == "mine\n"


def test_dest_gets_copies_of_the_cached_wheels(tmp_path, fake_builds):
    dest = tmp_path / "out" / "wheels"
    copies = build_wheels(cache_dir=tmp_path / "cache", out=dest, log=lambda *_: None)
    assert [w.parent for w in copies] == [dest, dest] and all(w.is_file() for w in copies)


def test_written_wheels_get_the_umask_mode_not_0600(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        wheel = _tiny_wheel(tmp_path / "wheels")
    finally:
        os.umask(old)
    assert oct(wheel.stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in wheel.parent.iterdir()] == [wheel.name]
