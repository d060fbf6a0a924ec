"""Measurements: the statistics of latency and RSS, the server log's tracebacks, the event log's validity and a
process's memory from /proc."""

import json
import math
import os
import re
import statistics

from bench.soak.config import MIB
from bench.harness import drive


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def median_ratio(numerator, denominator):
    """median(numerator) / median(denominator), or None when either is empty or the denominator's median is 0."""
    top, bottom = median_or_none(numerator), median_or_none(denominator)
    if top is None or not bottom:
        return None
    return top / bottom


def paired_median_ratio(numerator, denominator):
    """Median of the per-pair ratios ``numerator[i] / denominator[i]`` (pairs with a missing or zero value skipped)."""
    ratios = [a / b for a, b in zip(numerator, denominator) if a is not None and b]
    return statistics.median(ratios) if ratios else None


def theil_sen_slope(points):
    """Median of the slopes between every two points with different x (robust to outliers); None for < 2 xs."""
    points = sorted(points)
    slopes = []
    for i in range(len(points)):
        x1, y1 = points[i]
        for j in range(i + 1, len(points)):
            x2, y2 = points[j]
            if x2 != x1:
                slopes.append((y2 - y1) / (x2 - x1))
    return statistics.median(slopes) if slopes else None


def thin(points, limit=600):
    """Every k-th point so that at most ``limit`` remain (the last one always kept)."""
    if len(points) <= limit:
        return list(points)
    step = math.ceil(len(points) / limit)
    kept = list(points[::step])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def rss_growth_per_100(samples, prompts, warmup=0.2):
    """RSS growth in MiB per 100 prompts from ``(prompt_index, bytes)`` after-prompt samples.

    The first ``warmup`` fraction of the prompts (at least 1 prompt) is left out: first loads and allocator warm-up
    are not growth. Returns None with fewer than 3 samples left. The slope is Theil-Sen over at most 600 evenly
    spread samples.
    """
    start = max(1, int(math.ceil(prompts * warmup)))
    kept = [(x, y) for x, y in samples if x >= start and y is not None]
    if len(kept) < 3:
        return None
    slope = theil_sen_slope(thin(kept))
    return None if slope is None else slope * 100 / MIB


def describe(values):
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median": statistics.median(values), "min": ordered[0], "max": ordered[-1],
            "p90": ordered[min(len(ordered) - 1, int(math.ceil(0.9 * len(ordered))) - 1)],
            "mean": statistics.fmean(values)}



TRACEBACK_START = "Traceback (most recent call last):"
INTERNAL_ERROR = "comfy_memx: internal error"
LEAK_WARNING_TEXT = "WARNING, memory leak with model"
MEMX_LEAK_TEXT = "comfy_memx: leaked model"
_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
_VERSION = re.compile(r"comfy_memx (\S+) active")


def clean_line(line):
    """A log line without ANSI colours and without ComfyUI's ``[LEVEL]``/timestamp prefixes."""
    return _LOG_PREFIX.sub("", drive.strip_ansi(line).rstrip("\r\n"))


def find_tracebacks(text):
    """The Python tracebacks in a log: a list of blocks (lists of clean lines), each from its
    ``Traceback (most recent call last):`` line through its frames to the exception line(s)."""
    blocks = []
    current = None
    for raw in text.splitlines():
        line = clean_line(raw)
        if TRACEBACK_START in line:
            if current:
                blocks.append(current)
            current = [line.strip()]
            continue
        if current is None:
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            current.append(line)
            continue
        # the exception line ends the block; chained tracebacks start a new block with the next Traceback line
        current.append(line)
        blocks.append(current)
        current = None
    if current:
        blocks.append(current)
    return blocks


def mentions_comfy_memx(block):
    """Whether a traceback block has a frame in comfy_memx's code (or names comfy_memx in its exception)."""
    for line in block:
        frame = _FRAME.match(line)
        if frame and re.search(r"(^|[/\\])comfy_memx([/\\]|$)", frame.group(1)):
            return True
    return bool(block) and "comfy_memx" in block[-1]


def scan_log(text):
    """Counts and lines of interest in one server log."""
    tracebacks = find_tracebacks(text)
    memx_tracebacks = [block for block in tracebacks if mentions_comfy_memx(block)]
    lines = [clean_line(line) for line in text.splitlines()]
    version = next((m.group(1) for m in map(_VERSION.search, lines) if m), None)
    return {
        "bytes": len(text.encode("utf-8", "replace")),
        "tracebacks": len(tracebacks),
        "comfy_memx_tracebacks": len(memx_tracebacks),
        "comfy_memx_traceback_texts": ["\n".join(block)[-4000:] for block in memx_tracebacks[:5]],
        "other_traceback_texts": ["\n".join(block)[-2000:] for block in tracebacks if block not in memx_tracebacks][:3],
        "internal_errors": [line.strip() for line in lines if INTERNAL_ERROR in line][:20],
        "comfyui_leak_warnings": sum(LEAK_WARNING_TEXT in line for line in lines),
        "comfy_memx_leak_lines": sum(MEMX_LEAK_TEXT in line for line in lines),
        "comfy_memx_version": version,
    }


def validate_events(lines):
    """Check an event log given as an iterable of lines: every non-empty line must be a JSON object with a
    non-empty string ``event``, a number ``time`` and an int ``pid``. Returns counts, events by type and up to five
    invalid examples (``line``, ``error``)."""
    report = {"lines": 0, "bytes": 0, "valid": 0, "invalid": 0, "by_event": {}, "invalid_examples": [],
              "pids": []}
    pids = set()
    for number, line in enumerate(lines, 1):
        report["bytes"] += len(line.encode("utf-8", "replace")) if isinstance(line, str) else len(line)
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        if not line.strip():
            continue
        report["lines"] += 1
        error = None
        try:
            event = json.loads(line)
        except ValueError as exc:
            event, error = None, f"not JSON: {exc}"
        if error is None and not isinstance(event, dict):
            error = "not a JSON object"
        elif error is None:
            if not isinstance(event.get("event"), str) or not event["event"]:
                error = "no event name"
            elif isinstance(event.get("time"), bool) or not isinstance(event.get("time"), (int, float)):
                error = "no numeric time"
            elif isinstance(event.get("pid"), bool) or not isinstance(event.get("pid"), int):
                error = "no int pid"
        if error is None:
            report["valid"] += 1
            report["by_event"][event["event"]] = report["by_event"].get(event["event"], 0) + 1
            pids.add(event["pid"])
        else:
            report["invalid"] += 1
            if len(report["invalid_examples"]) < 5:
                report["invalid_examples"].append({"line": number, "error": error, "text": line[:200]})
    report["pids"] = sorted(pids)
    return report


def validate_event_file(path):
    if not path or not os.path.exists(path):
        return {"path": path, "exists": False, "lines": 0, "bytes": 0, "valid": 0, "invalid": 0, "by_event": {},
                "invalid_examples": [], "pids": []}
    with open(path, "rb") as handle:
        report = validate_events(handle)
    report.update(path=path, exists=True)
    return report



def read_proc_memory(pid):
    """``(VmRSS, RssAnon)`` of a process in bytes from /proc, or ``(None, None)``."""
    values = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None, None
    return values.get("VmRSS"), values.get("RssAnon")


def format_value(value, digits=3):
    """A figure as the soak summaries print it: ``-`` for None, floats with ``digits`` decimals."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
