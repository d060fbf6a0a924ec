"""Stand-ins for what answers on a hand-off peer's port: a squatter (another local user who bound it) that records
every request and answers ``done, freed 1e15`` to all, or an honest peer that follows ``sharing.peerproof`` with a
secret of its own (and claims to have freed more than it holds), or one that proves itself and then stalls on the
unload request until ``.release`` is set."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from comfy_memx.sharing import peerproof

LIAR_ANSWER = {"status": "done", "freed_bytes": 1e15, "freed": ["SDXL#1"], "proof": "0" * 64}


class Recorder(BaseHTTPRequestHandler):
    """A peer's port as the test plays it: records each request; a liar answers ``done, freed 1e15`` to all, an
    honest fake peer follows ``sharing.peerproof`` with its own secret (and claims more than it holds)."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append({"path": self.path, "headers": dict(self.headers), "body": raw.decode()})
        status, answer, proof = 200, LIAR_ANSWER, "f" * 64
        if self.server.honest:
            status, answer, proof = self.honestly(raw)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if proof:
            self.send_header(peerproof.PROOF_HEADER, peerproof.answer_proof(self.server.secret, proof, data)
                             if self.server.honest else proof)
        self.end_headers()
        self.wfile.write(data)

    def honestly(self, raw):
        who = peerproof.identity(self.server.token, self.server.url)
        if self.path == peerproof.HELLO_PATH:
            return 200, {"proof": peerproof.hello_proof(self.server.secret, json.loads(raw)["nonce"], who)}, None
        nonce = peerproof.check_request(self.headers.get(peerproof.AUTH_HEADER), self.server.secret, who, raw,
                                        self.server.replays)
        if nonce is None:
            return 403, {"error": "forbidden"}, None
        self.server.verified.append(json.loads(raw))
        if self.server.stall:
            self.server.release.wait(120)
        return 200, {"status": "done", "freed_bytes": 10 ** 15, "freed": ["BaseModel#3"]}, nonce

    def log_message(self, *args):
        pass


def fake_peer(honest=False, port=0, stall=False, token="cd" * 16):
    """A recording HTTP server on 127.0.0.1:``port`` (0: a free one) (``.url``, ``.seen``; honest ones: ``.secret``,
    ``.token``; with ``stall``, an honest one that holds its answer to the unload request until ``.release`` is
    set)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), Recorder)
    server.daemon_threads = True
    server.honest, server.seen, server.verified = honest or stall, [], []
    server.stall, server.release = stall, threading.Event()
    server.url = "http://127.0.0.1:%d" % server.server_address[1]
    server.secret, server.token, server.replays = peerproof.fresh_nonce(), token, peerproof.Replays()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
