"""The exposed surface on the stand-in server: the guarded routes refuse callers that are neither loopback nor hold the token,
one holder search at a time (429 with Retry-After), a CPU budget per minute, the read routes on their own executor,
bodies bounded and type-checked (400/413, never 500), hand-off peers proving their group, and no answer that shows
client addresses or the device a caller would need to unload someone.

A request relayed by a proxy (``X-Forwarded-For``) stands for a remote caller here; ``test_exposed_netns.py`` sends
real traffic from a non-loopback address."""

import asyncio
import json
import threading
from urllib.parse import quote

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.routekit import access
from comfy_memx.leaks import gate
from comfy_memx.surface import readmodel, routes
from memx_helpers import mode_of, umask
from test_routes import leaky, serve

TOKEN = "t0ken-for-the-tests-0123456789"
REMOTE = {"X-Forwarded-For": "203.0.113.7"}   # documentation address: never contacted, only a header


async def leaked_model(comfy):
    await comfy.run(leaky("a", leak=True))
    await comfy.run(leaky("b"))
    _, rows = await comfy.get_json("/memx/models")
    return quote(next(r["model_id"] for r in rows if r["state"] == "leaked"), safe="")


async def post(comfy, path, headers=None, **kwargs):
    response = await comfy.client.post(path, headers=headers or {}, **kwargs)
    return response.status, await response.json(), response.headers


@pytest.mark.parametrize("token_setting", [None, TOKEN])
def test_search_from_a_remote_caller_needs_the_token(tmp_path, token_setting):
    async def scenario(comfy):
        model_id = await leaked_model(comfy)
        path = f"/memx/models/{model_id}/search"
        return {"remote": await post(comfy, path, REMOTE),
                "wrong": await post(comfy, path, dict(REMOTE, Authorization="Bearer " + "x" * 30)),
                "bearer": await post(comfy, path, dict(REMOTE, Authorization="Bearer " + TOKEN)),
                "header": await post(comfy, path, dict(REMOTE, **{"X-Memx-Token": TOKEN})),
                "loopback": await post(comfy, path)}

    settings = {"token": token_setting} if token_setting else {}
    answers = serve("0.27.0", tmp_path, scenario, **settings)
    for name in ("remote", "wrong"):
        status, body, _ = answers[name]
        assert status == 403 and body["error"] == "forbidden" and "model" not in body
    for name in ("bearer", "header"):
        status, body, _ = answers[name]
        assert status == (200 if token_setting else 403), (name, body)
    status, body, _ = answers["loopback"]
    assert status == 200 and body["holders"] and body["holders"][0]["pattern"] == "class_cache"


def test_guarded_routes_refuse_a_rebound_host_or_another_origin_from_loopback_without_the_token(tmp_path,
                                                                                               monkeypatch):
    from comfy_memx.sharing import handoff

    async def scenario(comfy):
        handoff.start(1)
        model_id = await leaked_model(comfy)
        search, port = f"/memx/models/{model_id}/search", comfy.client.port

        def page_of(host):   # what a browser sends for a same-origin fetch of a page served as http://host:port
            return {"Host": f"{host}:{port}", "Origin": f"http://{host}:{port}", "Sec-Fetch-Site": "same-origin"}
        rebound = page_of("evil.example")   # evil.example's name now resolves to 127.0.0.1
        cases = {
            "rebound": (search, rebound), "rebound_handoff": ("/memx/handoff/request?bytes=10", rebound),
            "rebound_no_origin": (search, {"Host": f"evil.example:{port}"}),
            "rebound_with_token": (search, dict(rebound, Authorization="Bearer " + TOKEN)),
            "cross_site_origin": (search, {"Origin": "http://evil.example"}),
            "cross_site_fetch": (search, {"Sec-Fetch-Site": "cross-site"}),
            "origin_null": (search, {"Origin": "null"}),
            "other_port": (search, {"Origin": f"http://127.0.0.1:{port ^ 1}"}),
            "cross_site_with_token": (search, {"Origin": "http://evil.example", "X-Memx-Token": TOKEN}),
            "localhost": (search, page_of("localhost")), "loopback": (search, page_of("127.0.0.1")),
            "listed": (search, page_of("gpu-box.lan")), "listed_handoff": ("/memx/handoff/request?bytes=10",
                                                                          page_of("GPU-Box.lan")),
            "no_headers": (search, {}),
        }
        answers = {name: (await post(comfy, path, headers))[:2] for name, (path, headers) in cases.items()}
        answers["free"] = (await post(comfy, "/memx/free", rebound, json={"unload_models": True}))[:2]
        return answers

    answers = serve("0.27.0", tmp_path, scenario, token=TOKEN, allowed_hosts="gpu-box.lan", search_cpu=60,
                    **handoff_on(tmp_path, monkeypatch))
    refused = {"rebound", "rebound_handoff", "rebound_no_origin", "cross_site_origin", "cross_site_fetch",
               "origin_null", "other_port"}
    for name, (status, body) in answers.items():
        if name in refused:
            assert (status, body["error"]) == (403, "forbidden") and "model" not in body, (name, body)
        elif name != "free":
            assert status == 200, (name, body)
    status, receipt = answers["free"]
    assert status == 200 and receipt["status"] == "done"       # /memx/free itself is open, as ComfyUI's /free
    assert [s["search"] for s in receipt["survivors"]] == [{"note": routes.NOT_SEARCHED}]


def test_host_name_drops_port_brackets_case_and_the_final_dot():
    names = ["Evil.Example:8188", "[::1]:8188", "localhost.:80", "127.0.0.1", "", ":8188"]
    assert [access.host_name(h) for h in names] == ["evil.example", "::1", "localhost", "127.0.0.1", None, None]


def test_free_from_a_remote_caller_unloads_but_does_not_search_without_the_token(tmp_path):
    async def scenario(comfy):
        await leaked_model(comfy)
        plain = await post(comfy, "/memx/free", REMOTE, json=routes.FREE_ALL)
        with_token = await post(comfy, "/memx/free", dict(REMOTE, Authorization="Bearer " + TOKEN),
                                json=routes.FREE_ALL)
        return plain, with_token

    (status, receipt, _), (token_status, token_receipt, _) = serve("0.27.0", tmp_path, scenario, token=TOKEN)
    assert status == 200 and receipt["status"] == "done"
    [survivor] = receipt["survivors"]
    assert survivor["holders"] is None and survivor["search"] == {"note": routes.NOT_SEARCHED}
    assert token_status == 200 and token_receipt["survivors"][0]["holders"]


def test_one_search_at_a_time_the_next_gets_429_with_retry_after(tmp_path, monkeypatch):
    from comfy_memx.leaks import watch
    release, entered = threading.Event(), threading.Event()
    real = watch.search_now

    def held_search(record, ignore=(), budget_s=None):
        entered.set()
        assert release.wait(30)
        return real(record, ignore=ignore, budget_s=budget_s)
    monkeypatch.setattr(gate, "QUEUE_S", 0.05)

    async def scenario(comfy):
        model_id = await leaked_model(comfy)
        monkeypatch.setattr(watch, "search_now", held_search)
        path = f"/memx/models/{model_id}/search"
        first = asyncio.ensure_future(post(comfy, path))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        second = await post(comfy, path)
        reads = await comfy.get_json("/memx/models")           # answers while the search is held
        release.set()
        return await first, second, reads

    first, (status, body, headers), (read_status, rows) = serve("0.27.0", tmp_path, scenario)
    assert first[0] == 200
    assert status == 429 and body["error"] == "busy" and int(headers["Retry-After"]) >= 1
    assert read_status == 200 and rows


def test_a_spent_cpu_budget_refuses_searches_until_it_frees(tmp_path, monkeypatch):
    async def scenario(comfy):
        model_id = await leaked_model(comfy)
        searches = gate.gate()
        searches.cpu_left()
        searches._tokens = 0.0                                     # the bucket is empty
        refused = await post(comfy, f"/memx/models/{model_id}/search")
        receipt = await post(comfy, "/memx/free", json=routes.FREE_ALL)
        searches._tokens = None                                    # full again
        allowed = await post(comfy, f"/memx/models/{model_id}/search")
        return refused, receipt, allowed

    (status, body, headers), (_, receipt, _), (allowed_status, _, _) = serve("0.27.0", tmp_path, scenario,
                                                                             search_cpu=1)
    assert status == 429 and body["error"] == "cpu_budget" and 1 <= int(headers["Retry-After"]) <= 60
    assert "COMFY_MEMX_SEARCH_CPU" in body["message"]
    assert receipt["survivors"][0]["search"]["note"] == "not searched: cpu budget"
    assert allowed_status == 200


def test_models_answers_on_the_event_loop_and_the_timeline_on_the_reads_executor(tmp_path, monkeypatch):
    """``/memx/models`` never waits for an executor thread (the GIL trip that made its tail longer than ``/queue``'s);
    the timeline still builds on the reads executor."""
    threads = {"models": [], "timeline": []}
    real_row, real_timeline = readmodel.model_row, routes._timeline_body

    def row_spy(record, mm, listed):
        threads["models"].append(threading.current_thread().name)
        return real_row(record, mm, listed)

    def timeline_spy(since):
        threads["timeline"].append(threading.current_thread().name)
        return real_timeline(since)
    monkeypatch.setattr(readmodel, "model_row", row_spy)
    monkeypatch.setattr(routes, "_timeline_body", timeline_spy)

    async def scenario(comfy):
        await comfy.run(leaky("a"))
        loop_thread = threading.current_thread().name
        return loop_thread, await comfy.get_json("/memx/models"), await comfy.get_json("/memx/timeline")

    loop_thread, (status, rows), (timeline_status, _) = serve("0.27.0", tmp_path, scenario)
    assert status == 200 and rows and threads["models"] == [loop_thread] * len(rows)
    assert timeline_status == 200 and threads["timeline"]
    assert all(name.startswith("comfy_memx-reads") for name in threads["timeline"])


def test_concurrent_model_reads_share_one_build_and_see_every_load(tmp_path, monkeypatch):
    builds = []
    real = readmodel.model_row

    def counted(record, mm, listed):
        builds.append(record.model_id)
        return real(record, mm, listed)
    monkeypatch.setattr(readmodel, "model_row", counted)

    async def scenario(comfy):
        await comfy.run(leaky("a"))
        burst = await asyncio.gather(*(comfy.get_json("/memx/models") for _ in range(12)))
        built_for_burst = list(builds)
        await comfy.run(leaky("b"))
        _, after_load = await comfy.get_json("/memx/models")
        return burst, built_for_burst, after_load

    burst, built_for_burst, after_load = serve("0.27.0", tmp_path, scenario)
    assert all(status == 200 for status, _ in burst) and len({json.dumps(rows) for _, rows in burst}) == 1
    assert built_for_burst == [row["model_id"] for row in burst[0][1]]   # each row built once for the burst
    seen_in_burst = {row["model_id"] for row in burst[0][1]}
    assert {row["model_id"] for row in after_load} - seen_in_burst   # the model loaded after the burst is listed


DEEP = b"[" * 100000 + b"]" * 100000


@pytest.mark.parametrize("raw,status,kind", [
    (DEEP, 413, "body_too_large"),
    (b"[" * 50 + b"]" * 50, 400, "too_deep"),
    (b'{"a":' * 20 + b"1" + b"}" * 20, 400, "too_deep"),
    (b"{" + b" " * 20000 + b"}", 413, "body_too_large"),
    (b"[1]", 400, "bad_body"),
    (b'{"unload_models": "yes"}', 400, "bad_field"),
    (b'{"unload_models": 1}', 400, "bad_field"),
    (b'{"free_memory": NaN}', 400, "bad_json"),
    (b'{"free_memory": Infinity}', 400, "bad_json"),
    (b'{"free_memory": 1e999}', 400, "bad_json"),
    (b'\xff\xfe', 400, "bad_json"),
])
def test_bad_bodies_get_4xx_never_500(tmp_path, raw, status, kind):
    async def scenario(comfy):
        answer = await post(comfy, "/memx/free", data=raw)
        after = await post(comfy, "/memx/free?timeout=5", json=routes.FREE_ALL)  # the route still works
        return answer, after

    (got, body, _), (after_status, _, _) = serve("0.27.0", tmp_path, scenario)
    assert (got, body["error"]) == (status, kind) and body["message"]
    assert after_status == 200


SPLIT_S = 0.5   # between two parts of a body: long enough that the server reads the first part alone


async def post_in_parts(comfy, path, parts, headers=None):
    """POST ``parts`` over a raw connection, one write each, ``SPLIT_S`` apart (a body split across TCP segments);
    ``Content-Length`` is their total unless ``headers`` say ``Transfer-Encoding: chunked`` (then each part is sent
    as one chunk).  Returns (status, JSON answer)."""
    headers = dict(headers or {})
    chunked = headers.get("Transfer-Encoding") == "chunked"
    if not chunked:
        headers["Content-Length"] = str(sum(len(part) for part in parts))
    head = f"POST {path} HTTP/1.1\r\nHost: {comfy.client.host}:{comfy.client.port}\r\nConnection: close\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    reader, writer = await asyncio.open_connection(comfy.client.host, comfy.client.port)
    try:
        writer.write(head.encode("latin-1"))
        for index, part in enumerate(parts):
            if index:
                await asyncio.sleep(SPLIT_S)
            writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 120)    # the server closes after its answer
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_free_body_split_across_segments_is_read_whole(tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        split_json = await post_in_parts(comfy, "/memx/free", [b'{"unload_models": ', b'false, "free_memory": true}'])
        blank_first = await post_in_parts(comfy, "/memx/free",
                                          [b"   ", b'{"unload_models": true, "free_memory": false}'])
        chunked = await post_in_parts(comfy, "/memx/free", [b'{"unload_models": true,', b' "free_memory": false}'],
                                      {"Transfer-Encoding": "chunked"})
        return split_json, blank_first, chunked

    answers = serve("0.27.0", tmp_path, scenario)
    assert [status for status, _ in answers] == [200, 200, 200], answers
    (_, split_json), (_, blank_first), (_, chunked) = answers
    assert split_json["request"] == {"unload_models": False, "free_memory": True}
    assert blank_first["request"] == chunked["request"] == {"unload_models": True, "free_memory": False}


def test_a_handoff_body_split_across_segments_is_read_whole(tmp_path, monkeypatch):
    from comfy_memx.sharing import handoff

    async def scenario(comfy):
        handoff.start(1)
        parts = [b'{"bytes": 1, "from": 1, "device": ', b'"elsewhere"}']
        return await post_in_parts(comfy, "/memx/handoff", parts, peer_auth(b"".join(parts)))

    status, body = serve("0.27.0", tmp_path, scenario, **handoff_on(tmp_path, monkeypatch))
    assert (status, body["status"]) == (409, "other_device")


def test_an_over_limit_body_sent_in_small_chunks_gets_413(tmp_path):
    from comfy_memx.routekit import bodies
    pad = b" " * (bodies.MAX_BODY_BYTES // 2)

    async def scenario(comfy):
        over = await post_in_parts(comfy, "/memx/free", [b'{"unload_models": true' + pad, pad + b"}"],
                                   {"Transfer-Encoding": "chunked"})
        under = await post_in_parts(comfy, "/memx/free", [b'{"unload_models": true' + pad[:-100], b"}"],
                                    {"Transfer-Encoding": "chunked"})
        return over, under

    (status, body), (under_status, receipt) = serve("0.27.0", tmp_path, scenario)
    assert (status, body["error"]) == (413, "body_too_large")
    assert under_status == 200 and receipt["request"] == {"unload_models": True, "free_memory": False}


def test_a_body_that_never_arrives_whole_gets_408(tmp_path, monkeypatch):
    from comfy_memx.routekit import bodies
    monkeypatch.setattr(bodies, "READ_TIMEOUT_S", 0.2)

    async def scenario(comfy):
        reader, writer = await asyncio.open_connection(comfy.client.host, comfy.client.port)
        writer.write(b"POST /memx/free HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.readline(), 120)   # the 99 other bytes never come
        finally:
            writer.close()

    assert serve("0.27.0", tmp_path, scenario).split()[1] == b"408"


def handoff_on(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return {"handoff": "host"}


def peer_auth(raw, secret=None, now=None):
    """The headers of a ``POST /memx/handoff`` with body ``raw`` signed as a peer of the group signs it (with
    ``secret``: as someone who guessed)."""
    from comfy_memx.sharing import handoff, peerproof
    auth = peerproof.request_auth(secret or handoff.part().secret, handoff.identity(), raw, peerproof.fresh_nonce(),
                                  now=now)
    return {peerproof.AUTH_HEADER: auth}


@pytest.mark.parametrize("raw,kind", [
    (b'{"timeout": "abc"}', "bad_field"), (b"[1]", "bad_body"), (b'{"bytes": -5}', "bad_field"),
    (b'{"bytes": true}', "bad_field"), (b'{"from": 1.5}', "bad_field"), (b'{"device": 7}', "bad_field"),
    (b'{"timeout": 1e999}', "bad_json"), (b"[" * 40 + b"]" * 40, "too_deep"),
])
def test_handoff_bodies_are_type_checked(tmp_path, monkeypatch, raw, kind):
    from comfy_memx.sharing import handoff

    async def scenario(comfy):
        handoff.start(1)
        return await post(comfy, "/memx/handoff", peer_auth(raw), data=raw)

    status, body, _ = serve("0.27.0", tmp_path, scenario, **handoff_on(tmp_path, monkeypatch))
    assert (status, body["error"]) == (400, kind)


# what a number in a request must never be: other scripts' digits, signs, spaces, exponents, other bases, too long
NOT_NUMBERS = ["\u00b2", "\uff15", "\u0661", "1\u0660", "+5", "-5", " 5", "5 ", "\t5", "5\n", "1e3", "1E3",
               "0x10", "1_000", "nan", "inf", "Infinity", "", "1" * 25, "1" * 5000]
NOT_SECONDS = NOT_NUMBERS + [".5", "5.", "1.5e1", "1." + "5" * 40]
NOT_WHOLE = NOT_NUMBERS + ["1.5", "5.0"]


def test_every_query_number_is_ascii_digits_and_bounded_or_400(tmp_path, monkeypatch):
    from comfy_memx.sharing import handoff

    async def scenario(comfy):
        handoff.start(1)

        async def status_of(method, path, name, value):
            response = await comfy.client.request(method, path, params={name: value})
            return response.status, (await response.json())["error"] if response.status >= 400 else None

        answers = {}
        for method, path, name, values in [("GET", "/memx/timeline", "since", NOT_WHOLE),
                                           ("POST", "/memx/free", "timeout", NOT_SECONDS),
                                           ("POST", "/memx/handoff/request", "bytes", NOT_WHOLE + ["0"])]:
            answers[name] = {value: await status_of(method, path, name, value) for value in values}
        control = {"since": await status_of("GET", "/memx/timeline", "since", "0"),
                   "timeout": await status_of("POST", "/memx/free", "timeout", "30.5"),
                   "bytes": await status_of("POST", "/memx/handoff/request", "bytes", "10")}
        return answers, control

    answers, control = serve("0.27.0", tmp_path, scenario, **handoff_on(tmp_path, monkeypatch))
    kinds = {"since": "bad_since", "timeout": "bad_timeout", "bytes": "bad_bytes"}
    for name, by_value in answers.items():
        wrong = {value[:20]: got for value, got in by_value.items() if got != (400, kinds[name])}
        assert not wrong, (name, wrong)
    assert control == {"since": (200, None), "timeout": (200, None), "bytes": (200, None)}


@pytest.mark.parametrize("raw,kind", [
    (b'{"bytes": \xc2\xb2}', "bad_json"), ('{"bytes": 1\u0660}'.encode(), "bad_json"),
    (b'{"bytes": +5}', "bad_json"), (b'{"bytes": 05}', "bad_json"), (b'{"bytes": 0x10}', "bad_json"),
    (b'{"bytes": 1' + b"0" * 60 + b"}", "bad_json"), (b'{"timeout": 1.' + b"5" * 60 + b"}", "bad_json"),
    (b'{"bytes": 1e3}', "bad_field"), (b'{"bytes": -5}', "bad_field"), (b'{"bytes": "5"}', "bad_field"),
    (b'{"from": 2e0}', "bad_field"), (b'{"timeout": -0.5}', "bad_field"), (b'{"timeout": 1e999}', "bad_json"),
])
def test_body_numbers_are_ascii_json_numbers_bounded_or_400(tmp_path, monkeypatch, raw, kind):
    from comfy_memx.sharing import handoff

    async def scenario(comfy):
        handoff.start(1)
        return await post(comfy, "/memx/handoff", peer_auth(raw), data=raw)

    status, body, _ = serve("0.27.0", tmp_path, scenario, **handoff_on(tmp_path, monkeypatch))
    assert (status, body["error"]) == (400, kind)


def test_body_numbers_are_ascii_even_with_the_pure_python_json_scanner(monkeypatch):
    import json.scanner
    from comfy_memx.routekit import bodies
    fields = {"bytes": bodies.Field("int", 0, 2 ** 62)}
    monkeypatch.setattr(json.scanner, "make_scanner", json.scanner.py_make_scanner)   # its \d matches any digit
    assert bodies.parse_object(b'{"bytes": 12}', fields) == {"bytes": 12}
    for raw in ('{"bytes": 1\u0661}', '{"bytes": 1\uff15}', '{"bytes": 1' + "0" * 60 + "}"):
        with pytest.raises(bodies.BadBody) as info:
            bodies.parse_object(raw.encode(), fields)
        assert info.value.status == 400, raw


def test_handoff_needs_a_request_signed_with_the_peer_secret_and_never_names_the_device(tmp_path, monkeypatch):
    import time
    from comfy_memx.sharing import handoff, peerproof

    async def scenario(comfy):
        handoff.start(1)
        secret = handoff.part().secret
        raw = json.dumps({"bytes": 1, "from": 1, "device": "guess", "timeout": 1}).encode()
        signed = peer_auth(raw)
        answers = {"no_auth": await post(comfy, "/memx/handoff", data=raw),
                   "wrong_secret": await post(comfy, "/memx/handoff", peer_auth(raw, secret="x" * 32), data=raw),
                   "raw_secret": await post(comfy, "/memx/handoff", {"X-Memx-Peer": secret}, data=raw),
                   "token_only": await post(comfy, "/memx/handoff", {"Authorization": "Bearer " + TOKEN}, data=raw),
                   "other_body": await post(comfy, "/memx/handoff", signed, data=raw.replace(b'"from": 1', b'"from": 2')),
                   "stale": await post(comfy, "/memx/handoff", peer_auth(raw, now=time.time() - 10 * peerproof.WINDOW_S),
                                       data=raw),
                   "other_device": await post(comfy, "/memx/handoff", signed, data=raw),
                   "replayed": await post(comfy, "/memx/handoff", signed, data=raw),
                   "remote_request": await post(comfy, "/memx/handoff/request?bytes=10", REMOTE),
                   "device": handoff.part().device, "secret": secret}
        return answers

    answers = serve("0.27.0", tmp_path, scenario, token=TOKEN, **handoff_on(tmp_path, monkeypatch))
    for name in ("no_auth", "wrong_secret", "raw_secret", "token_only", "other_body", "stale", "replayed"):
        assert answers[name][0] == 403 and answers[name][1]["error"] == "forbidden", name
        assert peerproof.PROOF_HEADER not in answers[name][2], name
    status, body, headers = answers["other_device"]
    assert status == 409 and body["status"] == "other_device"
    assert answers["device"] not in json.dumps(body) and "device" not in body
    assert answers["secret"] not in json.dumps(body) + json.dumps(dict(headers))
    assert answers["remote_request"][0] == 403


def test_the_hello_answers_a_proof_of_the_callers_nonce_and_nothing_else(tmp_path, monkeypatch):
    from comfy_memx.sharing import handoff, peerproof
    nonce = peerproof.fresh_nonce()

    async def scenario(comfy):
        handoff.start(1)
        answers = {"hello": await post(comfy, peerproof.HELLO_PATH, json={"nonce": nonce}),
                   "again": await post(comfy, peerproof.HELLO_PATH, json={"nonce": nonce}),
                   "bad": await post(comfy, peerproof.HELLO_PATH, json={"nonce": "x" * 32}),
                   "none": await post(comfy, peerproof.HELLO_PATH, json={})}
        return answers, handoff.part().secret, handoff.identity()

    (answers, secret, who) = serve("0.27.0", tmp_path, scenario, **handoff_on(tmp_path, monkeypatch))
    status, body, _ = answers["hello"]
    assert status == 200 and body == {"proof": peerproof.hello_proof(secret, nonce, who)}
    assert answers["again"][1] == body                        # no state: a hello costs one HMAC
    assert body["proof"] != peerproof.hello_proof(secret, peerproof.fresh_nonce(), who)
    for name in ("bad", "none"):
        assert answers[name][0] == 400 and answers[name][1]["error"] == "bad_nonce", name


def test_handoff_routes_say_that_handoff_is_off_when_it_is(tmp_path):
    async def scenario(comfy):
        return [await post(comfy, path, json={"bytes": 1}) for path in ("/memx/handoff", "/memx/handoff/request?bytes=1",
                                                                       "/memx/handoff/hello")]

    for status, body, _ in serve("0.27.0", tmp_path, scenario):
        assert status == 404 and body["error"] == "handoff_off" and "COMFY_MEMX_HANDOFF=host" in body["message"]


def test_handoff_request_says_handoff_is_off_when_its_registry_cannot_be_used(tmp_path, monkeypatch, caplog):
    """COMFY_MEMX_HANDOFF=host, but this user's private folder is a link another process planted: the registry is
    refused at start, and asking by hand says hand-off is off (409) instead of a 200 that asked nobody."""
    import os
    from comfy_memx.core import hostshare
    from comfy_memx.sharing import handoff
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", base / f"comfy_memx-{os.getuid()}")
    monkeypatch.setattr(hostshare, "shared_base", lambda: str(base))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)

    async def scenario(comfy):
        assert handoff.start_safely(1) is None
        return await post(comfy, "/memx/handoff/request?bytes=1")

    status, body, _ = serve("0.27.0", tmp_path, scenario, handoff="host")
    assert (status, body["error"]) == (409, "handoff_off"), body
    assert "registry" in body["message"] and "GPU hand-off is off" in body["message"]
    assert any("GPU hand-off is off" in r.getMessage() for r in caplog.records)


def test_models_never_show_client_addresses(tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("a"))
        await post(comfy, "/memx/free", json={"unload_models": True})  # unloaded, still cached: listed
        response = await comfy.client.get("/memx/models")
        return await response.text()

    text = serve("0.27.0", tmp_path, scenario)
    [row] = json.loads(text)
    assert row["last_unload"]["requested_by"] == {"kind": "http", "route": "/memx/free", "clients": 1}
    assert "127.0.0.1" not in text and "::1" not in text


def test_free_events_written_for_requests_are_bounded_and_counted(tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        await comfy.run(leaky("a"))
        for _ in range(12):
            await post(comfy, "/memx/free?timeout=0", json=routes.FREE_ALL)
        return STATE.events.stats()

    stats = serve("0.27.0", tmp_path, scenario, events=events, event_rate=1)
    STATE.events.close()
    written = [json.loads(line) for line in events.read_text().splitlines()]
    frees = [e for e in written if e["event"] == "free"]
    assert stats["dropped"]["rate"] > 0 and len(frees) + stats["dropped"]["rate"] == 12


def test_the_events_file_is_0600_and_names_client_addresses_only_in_free_origins(tmp_path, monkeypatch):
    from comfy_memx.sharing import handoff
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        handoff.start(1)
        await comfy.run(leaky("a"))
        await post(comfy, "/memx/free", json={"unload_models": True})
        await post(comfy, "/memx/handoff/request?bytes=10")
        return comfy.client.host

    with umask(0o022):
        client = serve("0.27.0", tmp_path, scenario, events=events, **handoff_on(tmp_path, monkeypatch))
        STATE.events.close()
    assert mode_of(events) == 0o600
    written = [json.loads(line) for line in events.read_text().splitlines()]
    assert {"load", "free", "handoff"} <= {e["event"] for e in written}
    with_address = [e for e in written if client in json.dumps(e)]
    assert [e["event"] for e in with_address] == ["free"] and with_address[0]["origin"]["client"] == client
    del with_address[0]["origin"]["client"]
    assert client not in json.dumps(with_address[0])   # the README says why there, and nowhere else


def test_is_loopback_covers_v4_v6_and_mapped_addresses():
    assert all(access.is_loopback(a) for a in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"))
    assert not any(access.is_loopback(a) for a in ("10.213.0.2", "192.168.1.5", "::ffff:10.0.0.1", "fe80::1",
                                                    "not-an-ip"))


def test_a_hung_peer_holds_neither_the_reads_nor_a_second_handoff_request(tmp_path, monkeypatch):
    import socket
    from comfy_memx.core.hostshare import Peer
    from comfy_memx.sharing import handoff
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)             # accepts connections into its backlog and never answers
    url = "http://127.0.0.1:%d" % hung.getsockname()[1]

    async def scenario(comfy):
        handoff.start(1)
        monkeypatch.setattr(handoff.part().registry, "peers", lambda: {
            "ab" * 16: Peer(4242, 0, {"device": handoff.part().device, "url": url, "secret": "s" * 32})})
        asking = [asyncio.ensure_future(post(comfy, "/memx/handoff/request?bytes=10")) for _ in range(12)]
        await asyncio.sleep(0.2)
        reads = [await comfy.get_json("/memx/models") for _ in range(5)]   # answered while a peer hangs
        answers = await asyncio.gather(*asking)
        return reads, answers

    try:
        reads, answers = serve("0.27.0", tmp_path, scenario, handoff_wait=2, **handoff_on(tmp_path, monkeypatch))
    finally:
        hung.close()
    assert all(status == 200 for status, _ in reads)
    statuses = sorted(status for status, _, _ in answers)
    assert statuses.count(200) == 1 and statuses.count(429) == 11
    [done] = [body for status, body, _ in answers if status == 200]
    assert done["peers_asked"] == [{"pid": 4242, "status": "unreachable"}] and done["freed_bytes"] == 0


def test_handoff_groups_have_registries_of_their_own(tmp_path, monkeypatch):
    from comfy_memx.core import config
    from comfy_memx.core.state import STATE
    from comfy_memx.sharing import handoff
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os_paths = set()
    for group in ("default", "team-a"):
        monkeypatch.setattr(STATE, "config", config.parse({"COMFY_MEMX_HANDOFF_GROUP": group}))
        os_paths.add(handoff.registry_path())
    assert os_paths == {str(tmp_path / "comfy_memx-instances-default.json"),
                        str(tmp_path / "comfy_memx-instances-team-a.json")}
    with pytest.raises(config.ConfigError, match="COMFY_MEMX_HANDOFF_GROUP"):
        config.parse({"COMFY_MEMX_HANDOFF_GROUP": "../etc"})


def test_the_token_is_never_shown_and_a_short_one_is_refused():
    from comfy_memx.core import config
    cfg = config.parse({"COMFY_MEMX_TOKEN": TOKEN})
    assert cfg.token == TOKEN and cfg.as_dict()["token"] == "<set>" and TOKEN not in repr(cfg.as_dict())
    with pytest.raises(config.ConfigError) as info:
        config.parse({"COMFY_MEMX_TOKEN": "short"})
    assert "COMFY_MEMX_TOKEN" in str(info.value) and "16" in str(info.value) and "short" not in str(info.value)


def test_depth_skips_brackets_inside_strings():
    from comfy_memx.routekit import bodies
    assert bodies.depth(b'{"a": "[[[[[[[[[[[[\\"[[[["}') == 1
    assert bodies.depth(b'[[["]"]]]') == 3
    with pytest.raises(bodies.BadBody):
        bodies.parse_object(b'{"x": ' + b"[" * 9 + b"]" * 9 + b"}", {})


def test_concurrent_frees_do_not_queue_behind_a_running_search(tmp_path, monkeypatch):
    from comfy_memx.leaks import watch
    release, entered = threading.Event(), threading.Event()
    real = watch.search_now

    def held_search(record, ignore=(), budget_s=None):
        if not entered.is_set():
            entered.set()
            assert release.wait(60)
        return real(record, ignore=ignore, budget_s=budget_s)

    async def scenario(comfy):
        model_id = await leaked_model(comfy)
        monkeypatch.setattr(watch, "search_now", held_search)
        searching = asyncio.ensure_future(post(comfy, f"/memx/models/{model_id}/search"))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        frees = await asyncio.gather(*[post(comfy, "/memx/free", json={"unload_models": True}) for _ in range(6)])
        release.set()
        return frees, await searching

    frees, (search_status, _, _) = serve("0.27.0", tmp_path, scenario)
    assert search_status == 200
    for status, receipt, _ in frees:
        assert status == 200 and receipt["survivors"]
        assert all(s["search"]["note"] == "not searched: busy" for s in receipt["survivors"])


ELSEWHERE_PACK = '''
"""A pack that keeps each model it loads in a list of a module outside custom_nodes/, where only the strict backward
search finds it (the forward probe walks the packs' own modules)."""
import sys
import types

import comfy.model_base
import comfy.model_management
import comfy.model_patcher

KEPT = sys.modules.setdefault("memx_kept_elsewhere", types.ModuleType("memx_kept_elsewhere"))
KEPT.__dict__.setdefault("HELD", [])


class ElsewhereLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "m"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"

    def load(self, name):
        module = comfy.model_base.BaseModel(4, 1024)
        KEPT.HELD.append([[[[[[module]]]]]])   # six containers deep: a heap scan per level
        mm = comfy.model_management
        patcher = comfy.model_patcher.ModelPatcher(module, load_device=mm.get_torch_device(),
                                                   offload_device=mm.unet_offload_device())
        mm.load_models_gpu([patcher])
        return (patcher,)


NODE_CLASS_MAPPINGS = {"ElsewhereLoader": ElsewhereLoader}
'''


def test_twenty_anonymous_frees_search_no_more_than_the_search_cpu_budget(tmp_path, monkeypatch):
    """Each remote free without the token leaves a model a pack keeps where only a strict search finds it: the
    searches that free causes (the never-warned check after its collection) run outside any prompt, so the search
    gate pays for them, and all of them together stay within COMFY_MEMX_SEARCH_CPU by the gate's own books."""
    import sys
    import time
    from comfy_memx.leaks import holders
    from comfy_memx.ledger import api as ledger
    outside = []   # CPU seconds of every holder search that ran outside a prompt
    real = holders.find_holders

    def measured(*args, **kwargs):
        before = time.thread_time()
        try:
            return real(*args, **kwargs)
        finally:
            if ledger.current_prompt_id() is None:
                outside.append(time.thread_time() - before)
    monkeypatch.setattr(holders, "find_holders", measured)
    search_cpu, leak_budget = 0.3, 0.1         # a bucket of 0.1 s, refilled at 0.005 s per second

    async def scenario(comfy):
        import nodes
        folder = tmp_path / "custom_nodes" / "elsewhere_pack"
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(ELSEWHERE_PACK)
        assert await nodes.load_custom_node(str(folder)) is not False
        ballast = [[] for _ in range(250_000)]   # a heap like a busy server's: each heap scan of a search costs
        searches = gate.gate()
        start = time.monotonic()
        answers = []
        for i in range(20):
            await comfy.run({"1": {"class_type": "ElsewhereLoader", "inputs": {"name": f"m{i}"}},
                             "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}})
            answers.append((await post(comfy, "/memx/free", REMOTE, json=routes.FREE_ALL))[:2])
        del ballast
        return answers, dict(searches.counters), time.monotonic() - start

    try:
        answers, counters, elapsed = serve("0.27.0", tmp_path, scenario, leak_mode="strict", search_cpu=search_cpu,
                                           leak_budget=leak_budget)
    finally:
        sys.modules.pop("memx_kept_elsewhere", None)
    assert all(status == 200 and receipt["status"] == "done" for status, receipt in answers)
    assert all(s["search"] == {"note": routes.NOT_SEARCHED} for _, r in answers for s in r["survivors"])
    allowed = leak_budget + search_cpu / 60.0 * elapsed
    counted = counters.get("cpu_seconds", 0.0)
    assert outside and sum(outside) <= counted + 0.005, (sum(outside), counters)   # all of it in the gate's books
    assert counters.get("refused_budget", 0) > 0                                  # the budget stopped the rest
    assert counted <= allowed + leak_budget, (counters, elapsed)                  # one search may overrun
