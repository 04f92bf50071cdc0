"""The JavaScript a kit's pages load, from this package, never from a CDN: a slide deck must work
in a room without network.

- **reveal.js** (MIT) is vendored: the five files a deck loads (`dist/reveal.js`, `dist/reveal.css`,
  `dist/theme/white.css`, `plugin/notes/notes.js`, `LICENSE`; about 240 KB) are committed under
  `nwor_lab/workshop/vendor/reveal.js/`, taken from reveal.js's npm package, with `VENDOR.json`
  recording the version, the tarball's npm integrity and every file's sha256. Committed because a
  fresh clone must build a working deck offline (no npm, no network at build time), and the files
  are small and MIT-licensed. One change: `white.css` no longer `@import`s its Source Sans Pro web
  fonts (1.8 MB); the theme's own fallback stack (Helvetica, sans-serif) is used.
  `python -m nwor_lab.workshop.vendor --refresh 5.2.1` re-fetches them with `npm pack` (the only
  step that needs npm and the registry); `--check` verifies the committed files against VENDOR.json.
  Version 5.x: the last major whose layout (`dist/`, `plugin/notes/notes.js`) is the one nbconvert's
  reveal template expects; 6.x moved the plugins.
- **plotly.js** comes with the `plotly` Python package the lab already depends on
  (`plotly/package_data/plotly.min.js`), copied into the kit at build time.

`install(out)` copies both into a kit folder: `out/reveal.js/...` and `out/assets/plotly.min.js`,
which the kit's pages reference by relative path.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent / "vendor" / "reveal.js"
RECORD = VENDOR / "VENDOR.json"
FILES = ("LICENSE", "dist/reveal.js", "dist/reveal.css", "dist/theme/white.css", "plugin/notes/notes.js")
FONT_IMPORT = "@import url(./fonts/source-sans-pro/source-sans-pro.css);"
REVEAL_DIR = "reveal.js"           # in a kit folder
PLOTLY_JS = "assets/plotly.min.js"  # in a kit folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check() -> list[str]:
    """Problems with the committed reveal.js files (missing, or not what VENDOR.json records); [] if none."""
    if not RECORD.exists():
        return [f"{RECORD} is missing (python -m nwor_lab.workshop.vendor --refresh VERSION)"]
    record = json.loads(RECORD.read_text())
    problems = []
    for name in FILES:
        path = VENDOR / name
        if not path.exists():
            problems.append(f"{path} is missing")
        elif _sha256(path) != record["files"].get(name):
            problems.append(f"{path} differs from VENDOR.json (sha256)")
    return problems


def plotly_js() -> Path:
    import plotly
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the plotly package ships no plotly.min.js; reinstall plotly")
    return path


def install(out: Path) -> None:
    """Copy reveal.js and plotly.js into the kit folder `out` (replacing what a previous build left)."""
    problems = check()
    if problems:
        raise RuntimeError("vendored reveal.js: " + "; ".join(problems))
    out = Path(out)
    for name in FILES:
        target = out / REVEAL_DIR / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(VENDOR / name, target)
    (out / PLOTLY_JS).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plotly_js(), out / PLOTLY_JS)


def refresh(version: str) -> dict:
    """Fetch reveal.js `version` with `npm pack` and replace the vendored files and VENDOR.json."""
    with tempfile.TemporaryDirectory() as tmp:
        packed = json.loads(subprocess.run(["npm", "pack", f"reveal.js@{version}", "--json"], cwd=tmp, check=True,
                                           capture_output=True, text=True).stdout)[0]
        with tarfile.open(Path(tmp) / packed["filename"]) as tar:
            tar.extractall(tmp, filter="data")
        for name in FILES:
            target = VENDOR / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / "package" / name, target)
    theme = VENDOR / "dist/theme/white.css"
    text = theme.read_text()
    if FONT_IMPORT not in text:
        raise RuntimeError(f"{theme}: no font @import to remove; check the theme of reveal.js {version} by hand")
    theme.write_text(text.replace(FONT_IMPORT, "/* nwor_lab: web font @import removed (offline; the fallback stack applies) */"))
    record = {"package": "reveal.js", "version": packed["version"], "license": "MIT",
              "tarball": f"https://registry.npmjs.org/reveal.js/-/reveal.js-{packed['version']}.tgz",
              "integrity": packed["integrity"], "fetched_with": "npm pack",
              "modified": {"dist/theme/white.css": "the Source Sans Pro @import removed"},
              "files": {name: _sha256(VENDOR / name) for name in FILES}}
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m nwor_lab.workshop.vendor", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="verify the committed files against VENDOR.json")
    g.add_argument("--refresh", metavar="VERSION", help="re-fetch reveal.js VERSION with npm pack")
    args = p.parse_args(argv)
    if args.refresh:
        record = refresh(args.refresh)
        print(f"reveal.js {record['version']} vendored in {VENDOR} ({record['integrity']})")
        return 0
    problems = check()
    print("\n".join(problems) or f"reveal.js {json.loads(RECORD.read_text())['version']}: every file matches VENDOR.json")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
