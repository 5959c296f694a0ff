"""The course's website, read as a reader would, in headless Chromium (.ci/run runs this).

    python tools/check_site.py [SITE] [--screenshots DIR]

Serves SITE (what `make site` built) on 127.0.0.1 and opens every page of both editions
in Debian's Chromium through Playwright: each page loads; every link inside the site and
every image it shows resolves; no link is a placeholder (an address with ``<...>`` in it);
every figure is a link to its full-size image; no paragraph is a Markdown pipe table left as
text; the edition switch of every page leads to a page of the other edition (the same
notebook where there is one); every notebook page has its download, and its Colab link when
any has one (a site built without a repository URL has none); solutions are folded; and the
Japanese pages draw their text in a font that has Japanese glyphs (asked of Chromium itself,
not guessed). Keeps screenshots of a notebook page of each edition. Exits 1 naming every
problem; check() returns them as Problem(page, kind, detail).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# fonts without Japanese glyphs: a page drawn in one of them shows boxes or a fallback
LATIN_ONLY = re.compile(r"dejavu|liberation|lato|roboto|helvetica|arial|freesans", re.I)
# a Markdown table's delimiter row, |---|---:|, as a paragraph's text shows it (Sphinx's
# smart quotes make --- a dash)
_CELL = r"\s*:?(?:-{3,}|[\u2013\u2014]-*):?\s*"
PIPE_TABLE = re.compile(rf"\|{_CELL}(?:\|{_CELL})*\|")


class Problem(NamedTuple):
    """``kind``: load, link, image, placeholder, figure-link, raw-table, switch, colab,
    download, solutions, font."""
    page: str
    kind: str
    detail: str

    def __str__(self):
        return f"{self.page}: {self.kind}: {self.detail}"


def placeholder(url: str) -> bool:
    """An address not filled in: ``https://github.com/<your-github-user>/…``."""
    return bool(re.search(r"[<>]", urllib.parse.unquote(url)))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):   # a cancelled image, say
            super().handle_error(request, client_address)


def serve(root: Path):
    handler = functools.partial(QuietHandler, directory=str(root))
    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def exists(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.split("#")[0], timeout=10) as answer:
            return answer.status == 200
    except urllib.error.URLError:
        return False


def japanese_fonts(page) -> list:
    """The platform fonts Chromium drew the page's first Japanese paragraph with."""
    found = page.evaluate("""() => {
        const p = [...document.querySelectorAll('article p')]
            .find(e => /[\u3040-\u30ff\u4e00-\u9fff]/.test(e.textContent));
        if (p) p.setAttribute('data-japanese', '');
        return !!p; }""")
    if not found:
        return []
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": "[data-japanese]"})
    return [f["familyName"] for f in cdp.send("CSS.getPlatformFontsForNode",
                                               {"nodeId": node["nodeId"]})["fonts"]]


def check(site: Path, screenshots: Path, only=None) -> list:
    """The problems of the pages of ``site`` (``only``: these pages of it) as Problems."""
    from playwright.sync_api import sync_playwright
    browser_path = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser_path is None:
        return [Problem("", "browser", "no Chromium on PATH (Debian: apt-get install chromium)")]
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if not {"_static", "_sources", "jupyter_execute"} & set(p.parts))
    pages = [p for p in pages if only is None or p in only]
    notebooks = [p for p in pages if re.match(r"(ja/)?\d\d_\w+\.html$", p)]
    problems, resolved, colab = [], {}, {}
    server, base = serve(site)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for name in pages:
                answer = page.goto(base + name)
                if answer is None or not answer.ok:
                    problems.append(Problem(name, "load", str(answer and answer.status)))
                    continue
                links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
                images = page.eval_on_selector_all("img", "els => els.map(e => e.src)")
                for url in {u.split("#")[0] for u in links + images if u.startswith(base)}:
                    if url not in resolved:
                        resolved[url] = exists(url)
                    if not resolved[url]:
                        problems.append(Problem(name, "link", url[len(base):]))
                problems += [Problem(name, "placeholder", u) for u in links + images
                             if placeholder(u)]
                broken = page.eval_on_selector_all(
                    "img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0))"
                           ".map(e => e.src)")     # the site's own (no network here)
                problems += [Problem(name, "image", src[len(base):]) for src in broken
                             if src.startswith(base)]
                # a figure of the site opens full size: a link to its own file around it
                unlinked = page.eval_on_selector_all("article img", """els => els
                    .filter(e => { const a = e.closest('a[href]');
                        return !a || (e.src.includes('/_images/') && a.href !== e.src); })
                    .map(e => e.src)""")
                problems += [Problem(name, "figure-link", src[len(base):]) for src in unlinked]
                texts = page.eval_on_selector_all("article p", """els => els.map(e => {
                    const c = e.cloneNode(true);
                    c.querySelectorAll('code').forEach(k => k.remove());
                    return c.textContent; })""")
                problems += [Problem(name, "raw-table", t.strip()[:80]) for t in texts
                             if PIPE_TABLE.search(t)]
                switch = page.query_selector("a.edition-switch")
                if switch is None:
                    problems.append(Problem(name, "switch", "no edition switch"))
                else:
                    twin = urllib.parse.urljoin(base + name, switch.get_attribute("href"))
                    lang = page.get_attribute("html", "lang")
                    if not exists(twin):
                        problems.append(Problem(name, "switch", f"leads nowhere ({twin})"))
                    elif name in notebooks and Path(twin).name != Path(name).name and exists(
                            base + (name[3:] if name.startswith("ja/") else "ja/" + name)):
                        problems.append(Problem(name, "switch", f"leads to {twin}, not its twin"))
                    elif (lang == "ja") == twin[len(base):].startswith("ja/"):
                        problems.append(Problem(name, "switch", f"stays in the {lang} edition"))
                if name in notebooks:
                    colab[name] = any("colab.research.google.com/github/" in u for u in links)
                    if not any(u.endswith(".ipynb") for u in links):
                        problems.append(Problem(name, "download", "no download of the notebook"))
                    solutions = page.query_selector("h2:text-is('Solutions'), h2:text-is('解答')")
                    folded = page.query_selector_all(".tag_hide-cell details.hide")
                    if solutions and not folded:
                        problems.append(Problem(name, "solutions", "the solutions are not folded"))
                    if any(d.get_attribute("open") is not None for d in folded):
                        problems.append(Problem(name, "solutions", "unfolded from the start"))
            if any(colab.values()):          # a Colab link on one notebook page: on all
                problems += [Problem(n, "colab", "no Colab link") for n, has in colab.items()
                             if not has]
            if "ja/01_data.html" in pages:
                page.goto(base + "ja/01_data.html")
                fonts = japanese_fonts(page)
                if not fonts or all(LATIN_ONLY.search(f) for f in fonts):
                    problems.append(Problem("ja/01_data.html", "font", f"Japanese text drawn "
                                            f"with {fonts}, no font with Japanese glyphs (Debian: "
                                            "apt-get install fonts-ipafont-gothic)"))
                else:
                    print(f"check_site: Japanese text is drawn with {', '.join(fonts)}")
            screenshots.mkdir(parents=True, exist_ok=True)
            for name in ("04_evaluation.html", "ja/04_evaluation.html"):
                if name in pages:
                    page.goto(base + name)
                    shot = screenshots / ("site-" + name.replace("/", "-") + ".png")
                    page.screenshot(path=str(shot))
                    print(f"check_site: screenshot {shot}")
            browser.close()
    finally:
        server.shutdown()
    print(f"check_site: {len(pages)} pages, {len(resolved)} links and images checked")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", type=Path, default=REPO / "site")
    parser.add_argument("--screenshots", type=Path,
                        default=Path(os.environ.get("MEDAIDET_SCREENSHOTS", REPO / "screenshots")))
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file() or not (args.site / "ja" / "index.html").is_file():
        print(f"check_site: no site at {args.site}: build it with make site", file=sys.stderr)
        return 2
    problems = check(args.site, args.screenshots)
    for problem in problems:
        print(f"check_site: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
