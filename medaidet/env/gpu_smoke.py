"""``python -m medaidet.env.gpu_smoke gpu|cpu``: a small real GPU workload in a child (a sum,
a (32, 8732) argsort as hard-negative mining does, SSD300 forward twice); prints one JSON line
(``ok``, timings in ms, or the traceback). ``cpu``: NumPy (tests)."""
import importlib
import json
import sys
import time
import traceback


def smoke(device: str) -> dict:
    out = {"device": device}
    try:
        import medaidet  # noqa: F401  (sets CHAINER_CUDNN=0 on CuPy 14, before chainer)
        import numpy as np

        from medaidet.device import device_kind
        gpu = device_kind(device) != "cpu"   # "gpu" (or a GPU number): GPU 0
        xp = importlib.import_module("cupy") if gpu else np

        def timed(key, run):
            t = time.perf_counter()
            result = run()
            if gpu:
                xp.cuda.Device().synchronize()
            out[key] = (time.perf_counter() - t) * 1e3
            return result

        x = timed("alloc_ms", lambda: xp.ones(1 << 24, dtype=np.float32))
        assert float(x.sum()) == float(1 << 24), "sum of a ones array is wrong"
        a = np.random.RandomState(0).rand(32, 8732).astype(np.float32)
        order = timed("argsort_ms", lambda: xp.argsort(xp.asarray(a), axis=1))
        assert np.array_equal(np.take_along_axis(a, order.get() if gpu else order, 1),
                              np.sort(a, 1)), "argsort on (32, 8732) float32 disagrees with numpy"
        import chainer
        from chainercv.links import SSD300
        model = SSD300(n_fg_class=3)
        if gpu:
            model.to_gpu(0)
        img = xp.asarray(np.random.RandomState(1).rand(1, 3, 300, 300).astype(np.float32))
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            for key in ("ssd_first_ms", "ssd_ms"):  # the first call compiles kernels
                locs, confs = timed(key, lambda: model(img))
        assert locs.shape == confs.shape == (1, 8732, 4), (locs.shape, confs.shape)
        assert bool(xp.isfinite(confs.array).all()), "SSD300 forward gave non-finite scores"
        out["ok"] = True
    except BaseException:
        out.update(ok=False, error=traceback.format_exc()[-1500:])
    return out


def main(argv=None) -> int:
    print(json.dumps(smoke((sys.argv[1:] if argv is None else argv)[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
