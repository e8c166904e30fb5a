"""Every report kind, rendered in headless Chromium: screenshots to look at, and checks that fail on a broken page.

Runs the commands on zoo models into ``--out`` (a temporary folder by default): a search that selects a
configuration, a search where nothing is sufficient, necessity, pruning (two models), early decoding, a
search sweep (two models x two tasks x two ablations), a fixed-configuration sweep over the sixteen tasks
of ``arith-styles`` and the ground-truth recovery table. Then it opens every ``report.html`` below ``--out``
(the sweep cells' and ground-truth runs' too) in Chromium over the DevTools protocol (a pipe: no network, no
Python dependency) and writes one full-page PNG per report to ``--out/screenshots/`` (``--scale 0.5`` for
smaller files; ``--per-figure``: one PNG per figure too). A page fails when

* a script raised an error, the console logged one, or a file (``plotly.min.js``) did not load;
* a plotly figure did not render an SVG, has no data point and no annotation saying why, is taller than
  ``MAX_FIGURE_PX``, has overlapping tick labels, a legend over an axis title, tick labels or the colour bar,
  or a title wider than the figure;
* an axis with tick labels has no title, or a raw field name (``answer_prob``) as its title.

The exit status is 1 when a page fails (each problem is printed), 0 otherwise. The checks cannot see
everything: look at the PNGs. Needs Chromium (Debian: ``apt-get install chromium``); runs offline.

    python benchmarks/report_screenshots.py --out /tmp/af1-reports   # every kind: 8-12 minutes on 2 busy CPU cores
    python benchmarks/report_screenshots.py --only search,prune --out /tmp/r
    python benchmarks/report_screenshots.py --pages runs/demo/report.html --out /tmp/shots   # existing reports

docs/reports.md describes the reports and shows some of these screenshots.

Running it again into the same ``--out`` resumes the commands (nothing is recomputed but early decoding, which
has no resume) and screenshots again.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--mute-audio",
         "--hide-scrollbars", "--remote-debugging-pipe")
WIDTH = 1280
"""Viewport width of the screenshots (CSS pixels)."""
MAX_FIGURE_PX = 1400
"""A figure taller than this does not fit a screen: a page with one fails."""

NO_PROGRESS = ["--no-progress"]
COMMANDS: dict[str, list[list[str]]] = {
    # Selects (3, 1): the planted configuration of this ground truth.
    "search": [["search", "--model", "arith-gpt2-gt-w3t1", "--task", "add_sub", "--n-prompts", "100",
                "--fit-size", "2000", "--grid", "full", "--out", "{out}/search"]],
    # Zero ablation on arith-gpt2: no configuration reaches 0.9 (the empty smallest-transfer chart says why).
    "search-none": [["search", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "100", "--ablation", "zero",
                     "--out", "{out}/search-none"]],
    # arith-gpt2 needs every block a little: values between 0 and 1 with wide intervals, labelled above them.
    "necessity": [["necessity", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "100",
                   "--fit-size", "2000", "--out", "{out}/necessity"]],
    "prune": [["prune", "--model", "arith-gpt2-gt-w3t1", "--task", "add_sub", "--wait", "3", "--transfer", "1",
               "--n-prompts", "100", "--fit-size", "2000", "--out", "{out}/prune"],
              ["prune", "--model", "arith-gpt2-gt-w2t2", "--task", "add_sub", "--wait", "2", "--transfer", "2",
               "--n-prompts", "100", "--fit-size", "2000", "--out", "{out}/prune-w2t2"]],
    # --force: a finished lens run is refused otherwise (the only command without resume); 15-25 s again.
    "lens": [["lens", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "200", "--force",
              "--out", "{out}/lens"]],
    # A ground truth (high faithfulness) beside a model that does not wait (low): both ends of the colour scale.
    "sweep": [["sweep", "--models", "arith-gpt2-gt-w3t1,arith-llama", "--tasks", "add,sub", "--ablations", "cama,zero",
               "--n-prompts", "60", "--out", "{out}/sweep"]],
    "sweep-fixed": [["sweep", "--models", "arith-styles", "--tasks", "original,style", "--ablations", "cama,zero",
                     "--wait", "2", "--transfer", "2", "--n-prompts", "60", "--out", "{out}/sweep-fixed"]],
    "groundtruth": [["groundtruth", "--models", "arith-gpt2-gt-w3t1", "--ablations", "cama,zero", "--n-prompts", "60",
                     "--out", "{out}/groundtruth"]],
}
"""The commands of each report kind (``af1`` arguments; ``{out}`` is ``--out``)."""

# Runs in the page once every figure has drawn: what the page shows, per plotly figure.
INSPECT = r"""
(() => {
  const boxes = (nodes) => [...nodes].map(n => n.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0)
    .map(r => [r.left, r.top, r.right, r.bottom]);
  const flat = (a) => Array.from(a).flatMap(
    e => (e !== null && typeof e === 'object' && e.length !== undefined) ? flat(e) : [e]);
  // The values a trace shows: z (heatmaps), else y, else x; a bar chart of nulls shows nothing.
  // (numpy arrays arrive as {dtype, bdata, shape}, decoded into _inputArray.)
  const hasValue = (t) => { let v = t.z || t.y || t.x;
    if (v && v._inputArray) v = v._inputArray;
    return !!v && flat(v).some(e => e !== null && e !== undefined && !(typeof e === 'number' && isNaN(e))); };
  return [...document.querySelectorAll('.plotly-graph-div')].map(gd => {
    const fl = gd._fullLayout || {}, lay = gd.layout || {};
    // Titles as set (the full layout holds plotly's 'Click to enter ...' placeholders where none is).
    const text = (t) => (t && typeof t === 'object') ? (t.text || '') : (t || '');
    const axes = Object.keys(fl).filter(k => /^[xy]axis\d*$/.test(k));
    const ticks = {};
    for (const a of axes) ticks[a] = boxes(gd.querySelectorAll(`g.${a[0]}tick text`));  // one subplot per figure
    const rect = gd.getBoundingClientRect();
    const one = (sel) => boxes(gd.querySelectorAll(sel))[0] || null;
    return {
      id: gd.id,
      title: text(lay.title),
      rendered: !!gd.querySelector('svg.main-svg'),
      width: rect.width, height: rect.height, top: rect.top + window.scrollY, left: rect.left + window.scrollX,
      traces: (gd.data || []).length,
      withData: (gd.data || []).filter(t => t.visible !== false && hasValue(t)).length,
      annotations: (fl.annotations || []).map(a => a.text || ''),
      axisTitles: Object.fromEntries(axes.map(a => [a, text(lay[a] && lay[a].title)])),
      ticks,
      box: one('svg.main-svg'),
      titleBox: one('.g-gtitle text'),
      legendBox: one('g.legend'),
      labelBoxes: boxes(gd.querySelectorAll('.g-xtitle text, .g-ytitle text, g.xtick text, g.ytick text, g.colorbar')),
    };
  });
})()
"""


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: fd 3 reads
    commands, fd 4 writes replies, one JSON message per NUL-terminated record)."""

    def __init__(self, chromium: str = CHROMIUM, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="af1-chromium-")
        cmd_r, self.cmd_w = os.pipe()
        self.rep_r, rep_w = os.pipe()

        def fds() -> None:  # in the child: the pipe ends as fd 3 and 4 (duplicated first: they may be 3 or 4)
            a, b = os.dup(cmd_r), os.dup(rep_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = open(Path(self.profile) / "stderr.log", "w")
        self.proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     pass_fds=(3, 4), preexec_fn=fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        os.close(cmd_r)
        os.close(rep_w)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile go to :attr:`events`)."""
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply is None:
                raise TimeoutError(f"Chromium did not answer {method} within {self.timeout:g} s")
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self, deadline: float) -> dict[str, Any] | None:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rep_r], [], [], left)[0]:
                return None
            chunk = os.read(self.rep_r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (its log: {self.log.name})")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\0", 1)
        return json.loads(line)

    def pump(self, seconds: float) -> None:
        """Collect events for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (event := self._read(deadline)) is not None:
            self.events.append(event)

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - a browser that does not close is killed
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.rep_r)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def overlaps(boxes: Sequence[Sequence[float]], slack: float = 1.0) -> bool:
    """Whether two of the boxes ``[left, top, right, bottom]`` overlap by more than ``slack`` pixels both ways."""
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack:
                return True
    return False


RAW_NAME = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")


def problems_of(figures: Iterable[dict[str, Any]]) -> list[str]:
    """What does not read in the figures :data:`INSPECT` describes."""
    out = []
    for f in figures:
        name = f"{f['id']} ({re.sub('<[^>]+>', ' ', f['title'])[:60].strip() or 'untitled'})"
        if not f["rendered"] or f["width"] <= 0 or f["height"] <= 0:
            out.append(f"{name}: not rendered")
            continue
        if f["withData"] == 0 and not any(a.strip() for a in f["annotations"]):
            out.append(f"{name}: empty, and no annotation says why")
        if f["height"] > MAX_FIGURE_PX:
            out.append(f"{name}: {f['height']:.0f} px tall (more than {MAX_FIGURE_PX})")
        for axis, boxes in f["ticks"].items():
            if overlaps(boxes):
                out.append(f"{name}: overlapping tick labels on {axis}")
        box, title_box = f.get("box"), f.get("titleBox")
        if box and title_box and (title_box[0] < box[0] - 1 or title_box[2] > box[2] + 1):
            out.append(f"{name}: the title is cut off (wider than the figure)")
        if f.get("legendBox") and any(overlaps([f["legendBox"], b]) for b in f.get("labelBoxes", [])):
            out.append(f"{name}: the legend covers an axis title, tick labels or the colour bar")
        for axis, title in f["axisTitles"].items():
            if not title.strip() and f["ticks"].get(axis):
                out.append(f"{name}: no title on {axis}")
            if RAW_NAME.match(title.strip()):
                out.append(f"{name}: raw field name {title!r} as the {axis} title")
    return out


def shoot(browser: Browser, page: Path, png: Path | None, scale: float = 1.0, settle: float = 0.2,
          per_figure: bool = False) -> list[str]:
    """Open ``page``, wait until its figures drew, write a full-page screenshot to ``png`` (``scale``: 0.5
    halves it; ``per_figure``: also one ``<png stem>--fig<i>.png`` per figure) and return its problems
    (empty: the page reads as far as the checks can tell)."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    browser.events.clear()
    try:
        for domain in ("Page", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session)
        browser.send("Page.navigate", {"url": page.resolve().as_uri()}, session)
        deadline = time.monotonic() + browser.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in browser.events):
            if time.monotonic() > deadline:
                return [f"{page}: did not load within {browser.timeout:g} s"]
            browser.pump(0.2)
        browser.pump(settle)
        value = browser.send("Runtime.evaluate", {"expression": INSPECT, "returnByValue": True}, session)
        figures = value.get("result", {}).get("value") or []
        found = problems_of(figures)
        for e in browser.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                found.append(f"script error: {d.get('exception', {}).get('description') or d.get('text')}")
            elif method == "Runtime.consoleAPICalled" and p.get("type") == "error":
                found.append("console error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                found.append(f"error: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        if "plotly-graph-div" in page.read_text() and not figures:
            found.append("no figure drew (plotly.js missing?)")
        if png is not None:
            # Plotly's toolbar shows on hover in a browser: not part of the figure.
            browser.send("Runtime.evaluate", {"expression": "document.querySelectorAll('.modebar-container')"
                                              ".forEach(e => e.style.display = 'none')"}, session)
            height = browser.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                       "returnByValue": True}, session)["result"]["value"]
            shot = browser.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": scale}}, session)
            png.parent.mkdir(parents=True, exist_ok=True)
            png.write_bytes(base64.b64decode(shot["data"]))
            for f in figures if per_figure else []:
                clip = {"x": f["left"], "y": f["top"], "width": f["width"], "height": f["height"], "scale": scale}
                shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                               "clip": clip}, session)
                png.with_name(f"{png.stem}--{f['id']}.png").write_bytes(base64.b64decode(shot["data"]))
        return found
    finally:
        browser.send("Target.closeTarget", {"targetId": target})


def run_commands(out: Path, kinds: Sequence[str], python: str = sys.executable) -> None:
    """Run the commands of ``kinds`` (:data:`COMMANDS`) into ``out``; a failing command stops the script
    (a sweep with failed cells exits 2 but still writes its report, which is then checked)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}
    for kind in kinds:
        for args in COMMANDS[kind]:
            args = [a.replace("{out}", str(out)) for a in args] + NO_PROGRESS
            start = time.monotonic()
            print(f"[{kind}] af1 {' '.join(args)}", flush=True)
            done = subprocess.run([python, "-m", "circuits.cli", *args], env=env, cwd=REPO, text=True,
                                  capture_output=True)
            print(f"[{kind}] exit {done.returncode} in {time.monotonic() - start:.0f} s", flush=True)
            if done.returncode not in (0, 2) or (done.returncode == 2 and args[0] != "sweep"):
                sys.exit(f"af1 {args[0]} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")


def png_name(page: Path, root: Path) -> str:
    """``a/b/report.html`` -> ``a--b.png`` (the page's folder below ``root``)."""
    rel = page.resolve().parent.relative_to(root.resolve()) if page.resolve().is_relative_to(root.resolve()) else None
    parts = rel.parts if rel is not None and rel.parts else (page.resolve().parent.name,)
    return "--".join(parts) + ("" if page.name == "report.html" else "--" + page.stem) + ".png"


def check_pages(pages: Sequence[Path], shots: Path | None, root: Path, chromium: str = CHROMIUM,
                scale: float = 1.0, per_figure: bool = False) -> dict[str, list[str]]:
    """Screenshot each page into ``shots`` (None: only check) and return ``{page: problems}``."""
    result = {}
    with Browser(chromium) as browser:
        for page in pages:
            png = shots / png_name(page, root) if shots is not None else None
            result[str(page)] = shoot(browser, page, png, scale=scale, per_figure=per_figure)
            print(f"{'ok  ' if not result[str(page)] else 'FAIL'} {page}" + (f" -> {png}" if png else ""), flush=True)
            for p in result[str(page)]:
                print(f"     {p}", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the runs and screenshots/ (default: a new temporary folder)")
    parser.add_argument("--only", help=f"comma-separated kinds (default all: {','.join(COMMANDS)})")
    parser.add_argument("--pages", nargs="+", type=Path, help="check and screenshot these report files only")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", CHROMIUM), help=f"default {CHROMIUM}")
    parser.add_argument("--scale", type=float, default=1.0, help="screenshot scale (0.5: half size)")
    parser.add_argument("--per-figure", action="store_true", help="also one PNG per figure")
    args = parser.parse_args(argv)
    if not Path(args.chromium).is_file():
        parser.error(f"no Chromium at {args.chromium}: install it (Debian: apt-get install chromium) "
                     "or pass --chromium")
    out = Path(args.out or tempfile.mkdtemp(prefix="af1-reports-"))
    if args.pages:
        pages = list(args.pages)
        root = Path(os.path.commonpath([p.resolve().parent for p in pages]))
    else:
        kinds = args.only.split(",") if args.only else list(COMMANDS)
        unknown = [k for k in kinds if k not in COMMANDS]
        if unknown:
            parser.error(f"unknown kind(s) {', '.join(unknown)}; choose from {', '.join(COMMANDS)}")
        out.mkdir(parents=True, exist_ok=True)
        run_commands(out, kinds)
        pages = sorted(p for k in kinds for a in COMMANDS[k] for p in
                       Path(a[-1].replace("{out}", str(out))).rglob("report.html"))
        root = out
    result = check_pages(pages, out / "screenshots", root, args.chromium, args.scale, args.per_figure)
    failed = {p: v for p, v in result.items() if v}
    (out / "screenshots").mkdir(parents=True, exist_ok=True)
    (out / "screenshots" / "problems.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result)} report(s), {len(failed)} with problems; screenshots in {out / 'screenshots'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
