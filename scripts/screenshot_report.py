"""Screenshot a dpaudit report.html with headless Chromium, to look at it.

    python scripts/screenshot_report.py RUN_DIR [--out DIR] [--width 1400] [--height 5000]

Writes ``DIR/report.png`` (default DIR: RUN_DIR/screenshots) and, for a tall page, slices
``report-1.png``, ``report-2.png``, ... of at most 1800 pixels each (easier to view). Needs
``chromium`` (``apt-get install -y chromium``) and, for slicing, Pillow.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=5000)
    p.add_argument("--slice", type=int, default=1800, help="slice height in pixels (0: no slices)")
    args = p.parse_args(argv)

    html = (args.run_dir / "report.html").resolve()
    if not html.is_file():
        print(f"no report.html in {args.run_dir}", file=sys.stderr)
        return 2
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print("no chromium found: apt-get update && apt-get install -y chromium", file=sys.stderr)
        return 2
    out = (args.out or args.run_dir / "screenshots").resolve()
    out.mkdir(parents=True, exist_ok=True)
    png = out / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--screenshot={png}",
                        f"--window-size={args.width},{args.height}", html.as_uri()],
                       check=True, capture_output=True, timeout=120)
    print(png)
    if args.slice:
        try:
            from PIL import Image
        except ImportError:
            return 0
        with Image.open(png) as im:
            w, h = im.size
            for i, top in enumerate(range(0, h, args.slice), 1):
                part = out / f"report-{i}.png"
                im.crop((0, top, w, min(h, top + args.slice))).save(part)
                print(part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
