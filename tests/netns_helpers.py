"""A network namespace of the test's own, joined to this one by a veth pair, so that a request can come from a
non-loopback address.  The addresses (10.213.<n>.1 here, 10.213.<n>.2 there, a /30) exist only on this pair; no
traffic goes anywhere else.  Needs root and ``ip`` (iproute2); :func:`remote_namespace` skips the test otherwise."""

import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

CALL = r"""
import json, sys, urllib.request, urllib.error
method, url, headers, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
data = body.encode() if body else None
request = urllib.request.Request(url, data=data, method=method, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        status, raw, retry = response.status, response.read(), response.headers.get("Retry-After")
except urllib.error.HTTPError as error:
    status, raw, retry = error.code, error.read(), error.headers.get("Retry-After")
print(json.dumps({"status": status, "body": raw.decode("utf-8", "replace"), "retry_after": retry}))
"""


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@contextlib.contextmanager
def remote_namespace():
    """Yield ``(namespace, address_here, address_there)``; removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip(8) (iproute2) for a network namespace")
    n = os.getpid() % 250 + 1
    name, here, there = f"memx18-{os.getpid()}", f"memx18h{n}", f"memx18r{n}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    try:
        steps = [("link", "add", here, "type", "veth", "peer", "name", there),
                 ("link", "set", there, "netns", name),
                 ("addr", "add", f"10.213.{n}.1/30", "dev", here),
                 ("link", "set", here, "up"),
                 ("-n", name, "addr", "add", f"10.213.{n}.2/30", "dev", there),
                 ("-n", name, "link", "set", there, "up"),
                 ("-n", name, "link", "set", "lo", "up")]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(step)}): {done.stderr.strip()}")
        yield name, f"10.213.{n}.1", f"10.213.{n}.2"
    finally:
        _ip("link", "del", here)
        _ip("netns", "del", name)


def call_from(namespace, method, url, headers=None, body=None):
    """Send one request from inside ``namespace``; returns ``(status, parsed JSON or text, Retry-After)``."""
    assert url.startswith("http://10.213."), "only the namespace pair's own addresses are ever contacted"
    done = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", CALL, method, url,
                           json.dumps(headers or {}), json.dumps(body) if body is not None else ""],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    try:
        parsed = json.loads(answer["body"])
    except ValueError:
        parsed = answer["body"]
    return answer["status"], parsed, answer["retry_after"]
