"""``python -m comfy_memx doctor [--json] [--comfyui PATH]``: the baseline a user pastes into a bug report.

Prints comfy_memx's version and active config, Python, torch and CUDA, RAM and swap, and, for a ComfyUI tree, its
version and which patch sites would apply or be skipped (with reasons) — found by reading the tree's source with
``ast``, so ComfyUI is never imported or started.
"""

import argparse
import ast
import json
import os
import platform
import sys
import warnings

from comfy_memx._version import __version__
from comfy_memx.core import config, registry
from comfy_memx.core.comfyui import version_of_tree
from comfy_memx.core.errors import ConfigError
from comfy_memx.core.units import format_bytes
from comfy_memx.pins import cap as pincap, host as hostmem


def _module_file(tree, dotted):
    base = os.path.join(tree, *dotted.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _defined_names(body):
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            names[node.name] = _defined_names(node.body)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = None
    return names


def static_site_status(tree, disabled=()):
    """For each patch site: would it apply to the ComfyUI at ``tree``?  Reads source only."""
    rows = []
    for name in config.PATCH_NAMES:
        patch = registry.patch_of(name)
        path = _module_file(tree, patch.target)
        names = None
        if path is not None:
            try:
                names = _defined_names(ast.parse(open(path, encoding="utf-8").read()).body)
            except (OSError, SyntaxError) as exc:
                names, error = None, f"cannot read {path}: {exc}"
        for site in patch.sites:
            if name in disabled:
                state, reason = "skipped", "disabled by COMFY_MEMX_DISABLE"
            elif path is None:
                state, reason = "skipped", f"{patch.target} not found in this tree"
            elif names is None:
                state, reason = "skipped", error
            else:
                owner_name, _, attr = site.rpartition(".")
                scope = names.get(owner_name) if owner_name else names
                found = isinstance(scope, dict) and attr in scope
                state, reason = ("would patch", None) if found else ("skipped", "absent in this ComfyUI")
            label = site if patch.target == "comfy.model_management" else f"{patch.target}.{site}"
            rows.append({"patch": name, "site": label, "state": state, "reason": reason})
    return rows


def collect(comfyui=None, environ=None):
    """Everything doctor reports, as a JSON-ready dict.  Raises ConfigError on bad settings."""
    cfg = config.parse(environ)
    report = {"comfy_memx": __version__, "config": cfg.as_dict(), "config_warnings": list(cfg.warnings),
              "python": sys.version.split()[0], "platform": platform.platform()}
    report.update(_torch_facts())
    if comfyui is not None:
        tree = os.path.abspath(comfyui)
        report["comfyui"] = {"path": tree, "version": version_of_tree(tree),
                             "sites": static_site_status(tree, cfg.disable)}
    report.update(_pin_facts(cfg, report.get("comfyui", {}).get("version")))
    return report


def _pin_facts(cfg, comfyui_version_text):
    """RAM (clamped to the cgroup limit), disk swap versus zram, the cgroup limit and the pin caps (comfy_memx's
    and, for a tree, ComfyUI's), all from one host probe so that the figures agree with each other."""
    fields = pincap.doctor_fields(hostmem.probe_host(), cfg.pin_limit, comfyui_version_text)
    fields["host_warnings"] = fields.pop("warnings")
    return fields


def _torch_facts():
    try:
        with warnings.catch_warnings():   # torch without numpy warns at import; doctor reports no numpy facts
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch
    except ImportError as exc:
        return {"torch": None, "torch_error": str(exc), "cuda_available": False}
    return {"torch": torch.__version__, "cuda_available": bool(torch.cuda.is_available()),
            "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def format_text(report):
    """The human-readable form of :func:`collect`'s report."""
    lines = [f"comfy_memx {report['comfy_memx']}  (Python {report['python']}, {report['platform']})",
             f"torch {report.get('torch')}  CUDA available: {report.get('cuda_available')}"]
    limited = report["cgroup_limit_bytes"] is not None
    lines.append(f"RAM {format_bytes(report['ram_bytes'])}"
                 + (f" (cgroup limit; the host has {format_bytes(report['ram_physical_bytes'])})" if limited else "")
                 + f", available {format_bytes(report['ram_available_bytes'])}; disk swap "
                 + ("not counted under a cgroup limit" if limited else format_bytes(report["swap_disk_bytes"]))
                 + f", zram {format_bytes(report['swap_zram_bytes'])} (never counted)")
    theirs = report["comfyui_pin_cap_bytes"]
    lines.append(f"pinned-memory cap {format_bytes(report['pin_cap_bytes'])} ({report['pin_cap_source']})"
                 + (f"; ComfyUI would use {format_bytes(theirs)}" if theirs else "")
                 + " - applies only where ComfyUI pins (an NVIDIA or AMD GPU, 0.27.0 or newer)")
    lines += [f"warning: {w}" for w in report["host_warnings"]]
    lines.append("config: " + ", ".join(f"{k}={v}" for k, v in report["config"].items()))
    lines += [f"warning: {w}" for w in report["config_warnings"]]
    comfy = report.get("comfyui")
    if comfy:
        lines.append(f"ComfyUI at {comfy['path']}: version {comfy['version'] or 'unknown'}")
        for row in comfy["sites"]:
            lines.append(f"  {row['state']:<12} {row['site']}" + (f"  ({row['reason']})" if row["reason"] else ""))
    return "\n".join(lines)


def main(argv):
    """Entry point of ``python -m comfy_memx doctor``; returns the exit status."""
    description = __doc__.splitlines()[0].replace("``", "")   # --help is plain text, not reStructuredText
    parser = argparse.ArgumentParser(prog="python -m comfy_memx doctor", description=description)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--comfyui", metavar="PATH", help="a ComfyUI tree to check the patches against")
    args = parser.parse_args(argv)
    if args.comfyui is not None and not os.path.isfile(os.path.join(args.comfyui, "main.py")):
        print(f"comfy_memx doctor: {args.comfyui} is not a ComfyUI tree (no main.py)", file=sys.stderr)
        return 2
    try:
        report = collect(args.comfyui)
    except ConfigError as exc:
        print(f"comfy_memx doctor: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2, default=str) if args.json else format_text(report))
    return 0
