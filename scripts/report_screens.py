"""The HTML report as a browser shows it: headless Chromium measures a page and takes full-page screenshots.

``measure`` loads a page at a window width and reads, after the load event, how wide the page is against the
window, which elements run past its right edge and which images did not load; ``problems`` turns that into
sentences (``tests/report/test_html_browser.py`` fails on any). Run as a script, it takes full-page screenshots
of the committed reports (``benchmarks/results/**/report.html``) at 1,400 and 800 px into
``benchmarks/results/screens/`` and prints each page's measurements::

    python scripts/report_screens.py                  # every committed report.html
    python scripts/report_screens.py --out DIR A.html  # given pages, elsewhere
    python scripts/report_screens.py --render         # each page first rebuilt from its report.json

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``; ``KVAUDIT_CHROMIUM`` names another
binary), run with a new empty profile and no network services: no driver package is needed, the measurement is a
script appended to a copy of the page, read back from ``--dump-dom``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WIDTHS = (1400, 800)
SCREENS = REPO / "benchmarks" / "results" / "screens"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--force-device-scale-factor=1"]
#: appended to a copy of the page: after load, the page's width, the window's, the elements past the window's right
#: edge (the first few, named) and the images that did not decode, as JSON in a <pre> that --dump-dom returns
PROBE = """<script>addEventListener('load', () => {
  const W = window.innerWidth, d = document.documentElement;
  const name = x => x.tagName.toLowerCase() + (x.id ? '#' + x.id : '') + (x.className ? '.' + x.className : '');
  const wide = [...document.querySelectorAll('body *')].filter(x => x.getBoundingClientRect().right > W + 0.5);
  const outer = wide.filter(x => !wide.includes(x.parentElement)).slice(0, 8)
    .map(x => name(x) + ' to ' + Math.round(x.getBoundingClientRect().right) + ' px');
  const broken = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt.slice(0, 60));
  const p = document.createElement('pre'); p.id = 'kvaudit-probe';
  p.textContent = JSON.stringify({page: d.scrollWidth, window: W, height: d.scrollHeight,
                                  images: document.images.length, broken: broken, wide: outer});
  document.body.append(p);
});</script>"""
PROBED = re.compile(r'<pre id="kvaudit-probe">(.*?)</pre>', re.S)


def chromium() -> str | None:
    """The Chromium binary: ``KVAUDIT_CHROMIUM``, else ``chromium`` (Debian) or ``chromium-browser`` on PATH."""
    given = os.environ.get("KVAUDIT_CHROMIUM")
    if given:
        return given
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], timeout: float) -> str:
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium not found: apt-get install -y chromium (or set KVAUDIT_CHROMIUM)")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=timeout)
    return done.stdout


def measure(page: Path, width: int, height: int = 900, timeout: float = 60) -> dict[str, Any]:
    """How ``page`` lays out in a ``width`` px window: page and window width, page height, images, broken images,
    and the outermost elements past the window's right edge."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "page.html"
        probe.write_text(page.read_text(encoding="utf-8") + PROBE, encoding="utf-8")
        dom = _run([f"--window-size={width},{height}", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                   timeout)
    m = PROBED.search(dom)
    if m is None:
        raise RuntimeError(f"chromium returned no measurement for {page} at {width} px (is it a whole HTML page?)")
    import html

    return dict(json.loads(html.unescape(m.group(1))))


def measure_widths(page: Path, widths: tuple[int, ...] = WIDTHS) -> dict[int, dict[str, Any]]:
    """:func:`measure` at each width, the browsers side by side (each is a process of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(widths)) as pool:
        return dict(zip(widths, pool.map(lambda w: measure(page, w), widths)))


def problems(m: dict[str, Any]) -> list[str]:
    """What a reader would see go wrong: the page scrolls sideways, or an image is missing."""
    out = []
    if m["page"] > m["window"]:
        out.append(f"the page is {m['page']} px wide in a {m['window']} px window: " + "; ".join(m["wide"]))
    if m["broken"]:
        out.append(f"{len(m['broken'])} of {m['images']} images did not load: " + "; ".join(m["broken"]))
    return out


def screenshot(page: Path, width: int, out: Path, timeout: float = 120) -> dict[str, Any]:
    """A full-page PNG of ``page`` at ``width`` px (the window as tall as the page), and the page's measurements."""
    m = measure(page, width)
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--window-size={width},{m['height']}", "--virtual-time-budget=5000", f"--screenshot={out}",
          page.as_uri()], timeout)
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {page} at {width} px")
    _shrink(out)
    return m


def _shrink(png: Path) -> None:
    """A page is text on white: 128 colours keep it legible at a third of the bytes (Pillow comes with matplotlib;
    without it the PNG stays as Chromium wrote it)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as im:
        small = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


def render(page: Path) -> None:
    """``page`` rebuilt from the JSON report beside it, with this checkout's renderer (figures need matplotlib)."""
    from pytest_kvaudit.report import html

    html.write(json.loads(page.with_suffix(".json").read_text(encoding="utf-8")), page)


def committed() -> list[Path]:
    return sorted((REPO / "benchmarks" / "results").glob("**/report.html"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="*", type=Path, help="HTML pages (default: every committed report.html)")
    ap.add_argument("--out", type=Path, default=SCREENS, help=f"folder for the PNGs (default: {SCREENS})")
    ap.add_argument("--render", action="store_true",
                    help="first rebuild each page from the report.json beside it (as python -m "
                         "pytest_kvaudit.report.html does)")
    args = ap.parse_args(argv)
    if chromium() is None:
        print("chromium not found: apt-get install -y chromium (or set KVAUDIT_CHROMIUM)", file=sys.stderr)
        return 2
    bad = 0
    for page in args.pages or committed():
        page = page.resolve()
        if args.render:
            render(page)
        rel = page.relative_to(REPO / "benchmarks" / "results") if page.is_relative_to(REPO) else Path(page.name)
        stem = "-".join(rel.with_suffix("").parts).removesuffix("-report") or "report"
        for w in WIDTHS:
            out = args.out / f"{stem}-{w}.png"
            m = screenshot(page, w, out)
            said = problems(m)
            bad += bool(said)
            print(f"{out.relative_to(REPO) if out.is_relative_to(REPO) else out}: {m['page']} px wide in "
                  f"{m['window']}, {m['height']} px tall, {m['images']} images" + "".join(f"; {s}" for s in said))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
