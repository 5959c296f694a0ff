"""``import medaidet`` applies exactly the runtime settings that are needed."""
import pytest

from conftest import fake_distribution, run_python


@pytest.mark.parametrize("cupy, cudnn", [("14.0.0", "0"), ("13.6.0", "None")])
def test_cupy14_sets_cudnn_off_when_unset_and_cupy13_changes_nothing(site_dir, cupy, cudnn):
    fake_distribution(site_dir, "cupy-cuda12x", cupy)
    done = run_python("import os; os.environ.pop('CHAINER_CUDNN', None)\nimport medaidet\n"
                      "print(os.environ.get('CHAINER_CUDNN'))\n"
                      "print([a.name for a in medaidet.compat_actions])", extra_path=[site_dir])
    assert done.stdout.splitlines()[0] == cudnn, done.stderr
    assert ("CHAINER_CUDNN" in done.stdout.splitlines()[1]) == (cudnn == "0")


def test_warns_when_chainer_was_imported_first(site_dir):
    fake_distribution(site_dir, "cupy-cuda12x", "14.1.0")
    code = ("import os, warnings; os.environ.pop('CHAINER_CUDNN', None)\n"
            "import chainer\nwarnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import medaidet\n"
            "print([str(x.message) for x in w if 'import medaidet first' in str(x.message)])\n"
            "print(os.environ.get('CHAINER_CUDNN'))\n")
    done = run_python(code, extra_path=[site_dir])
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "import medaidet first" in out[-2] and out[-1] == "None"


def test_opencv_threads_set_to_zero_when_present(site_dir):
    cv2 = site_dir / "cv2"
    cv2.mkdir()
    (cv2 / "__init__.py").write_text("THREADS = [8]\n"
                                     "def setNumThreads(n): THREADS.append(n)\n")
    done = run_python("import medaidet, cv2; print(cv2.THREADS[-1])", extra_path=[site_dir])
    assert done.stdout.split()[-1] == "0"


def test_reapply_runs_the_settings_again_and_updates_the_package_record():
    """After `stack install` adds CuPy in a running kernel (Colab), settings are decided again."""
    import medaidet
    from medaidet import compat
    before = compat.apply()
    again = compat.reapply()
    assert [a.name for a in again] == [a.name for a in before]
    assert medaidet.compat_actions == again and compat.apply() == again
