"""web/: the page counts cells in headless Chromium as OnnxDetector does. Skipped without a
browser, Playwright or npm, except under CI_REQUIRE_BROWSER=1 (.ci/run), where it fails."""
import contextlib
import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from medaidet.extras.deploy import OnnxDetector, box_iou, export_onnx, read_rgb
from medaidet.ssd.weights import shipped_weights

from conftest import REPO, npm_ci

WEB = REPO / "web"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _missing(what: str):
    message = f"the browser test cannot run: {what}"
    if os.environ.get("CI_REQUIRE_BROWSER") == "1":
        pytest.fail(message + " (CI_REQUIRE_BROWSER=1: .ci/run installs it)", pytrace=False)
    pytest.skip("!!! " + message)


@pytest.fixture(scope="module")
def browser_path():
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if found is None:
        _missing("no Chromium on PATH (Debian: apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory, browser_path):
    """web/ with its node_modules (npm ci when missing) and an exported model, on 127.0.0.1."""
    npm_ci(WEB, "onnxruntime-web", _missing)
    root = tmp_path_factory.mktemp("site")
    for name in ("index.html", "app.js", "detector.js"):
        shutil.copy(WEB / name, root / name)
    (root / "node_modules").symlink_to(WEB / "node_modules")
    export_onnx(shipped_weights("ssd_small"), root / "model.onnx")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()


@contextlib.contextmanager
def _ready_page(site, browser_path, errors=None, **options):
    """A headless Chromium page on the site once the model is loaded; page errors to ``errors``."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, headless=True,
                                    args=["--no-sandbox"])
        page = browser.new_page(**options)
        if errors is not None:
            page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(site[1])
        page.wait_for_selector('#status[data-state="ready"]', timeout=60_000)
        yield page
        browser.close()


def _match(ours, theirs):
    """Pairs of the page's and Python's detections of one class, by IoU (greedy, best first)."""
    pairs, free = [], list(range(len(theirs)))
    for box in ours:
        if not free:
            break
        ious = box_iou(np.array([box], float), np.array([theirs[j] for j in free], float))[0]
        best = int(np.argmax(ious))
        pairs.append((box, theirs[free[best]], ious[best]))
        free.pop(best)
    return pairs


@pytest.mark.slow(seconds=14)
def test_the_page_counts_as_the_python_detector(site, browser_path, bccd_root, tmp_path):
    detector = OnnxDetector(site[0] / "model.onnx")
    images = sorted((bccd_root / "JPEGImages").glob("*.jpg"))[:3]
    shots = Path(os.environ.get("MEDAIDET_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    errors = []
    with _ready_page(site, browser_path, errors, viewport={"width": 900, "height": 1000}) as page:
        for image in images:
            page.set_input_files("#file", str(image))
            page.wait_for_function(
                f"window.medaidetResult && window.medaidetResult.image === {image.name!r}",
                timeout=60_000)
            result = page.evaluate("window.medaidetResult")
            assert page.get_attribute("#status", "data-state") == "done"
            bboxes, labels, scores = detector.predict([read_rgb(image)])
            counted = scores[0] >= 0.5
            expected = {name: int((labels[0][counted] == i).sum())
                        for i, name in enumerate(detector.label_names)}
            assert result["counts"] == expected, image.name
            for i, name in enumerate(detector.label_names):
                ours = [d["box"] for d in result["detections"] if d["labelName"] == name]
                theirs = bboxes[0][counted & (labels[0] == i)].tolist()
                for box, other, iou in _match(ours, theirs):
                    assert iou > 0.99 and np.abs(np.subtract(box, other)).max() < 1.0, \
                        (image.name, name, box, other)
            shown = {name: int(page.inner_text(f'td[data-class="{name}"]'))
                     for name in detector.label_names}
            assert shown == expected
        page.screenshot(path=str(shots / "web_page.png"), full_page=True)
    assert errors == []
    assert (shots / "web_page.png").stat().st_size > 10_000


@pytest.mark.slow(seconds=14)
def test_a_failed_or_superseded_pick_never_shows_another_images_results(site, browser_path,
                                                                       bccd_root, tmp_path):
    """A non-image clears the previous results; a slow pick never overwrites a later one."""
    from PIL import Image
    good = bccd_root / "JPEGImages" / "BloodImage_00000.jpg"
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image at all")
    slow = tmp_path / "slow.png"           # a large PNG: decoded and resized for longer
    with Image.open(good) as img:
        img.resize((4800, 3600)).save(slow)
    with _ready_page(site, browser_path) as page:
        page.set_input_files("#file", str(good))
        page.wait_for_function("window.medaidetResult", timeout=60_000)
        page.set_input_files("#file", str(broken))
        page.wait_for_selector('#status[data-state="error"]', timeout=60_000)
        assert page.inner_text("#status").startswith("broken.jpg: ")
        assert page.is_hidden("#counts") and page.is_hidden("#view")
        assert page.evaluate("window.medaidetResult") is None
        assert page.evaluate("getComputedStyle(document.getElementById('status')).color") \
            == "rgb(176, 0, 32)"
        page.evaluate("""([slow, fast]) => {
            const input = document.getElementById('file');
            for (const file of [slow, fast]) {
                const list = new DataTransfer(); list.items.add(file);
                input.files = list.files; input.dispatchEvent(new Event('change'));
            }
        }""", [page.evaluate_handle(f"""async () => new File([await (await fetch(
            'data:image/png;base64,{__import__('base64').b64encode(slow.read_bytes()).decode()}'
            )).blob()], 'slow.png', {{type: 'image/png'}})"""),
            page.evaluate_handle(f"""async () => new File([await (await fetch(
            'data:image/jpeg;base64,{__import__('base64').b64encode(good.read_bytes()).decode()}'
            )).blob()], 'fast.jpg', {{type: 'image/jpeg'}})""")])
        page.wait_for_function("window.medaidetResult && window.medaidetResult.image === "
                               "'fast.jpg'", timeout=60_000)
        page.wait_for_timeout(4000)          # the slow pick finishes meanwhile
        assert page.evaluate("window.medaidetResult.image") == "fast.jpg"
        assert page.inner_text("#status").startswith("fast.jpg: ")
