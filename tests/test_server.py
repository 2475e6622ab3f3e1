"""A real `specdec serve` process on loopback, driven by the official openai client and raw HTTP."""

import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir, *extra):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdec", "serve", "--target", str(model_dir), "--dtype",
                             "float32", "--port", str(port), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read()}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not start")


@pytest.fixture(scope="module")
def server(tiny_dirs):
    proc, base = start_server(tiny_dirs["chat"], "--api-key", KEY, "--max-queue", "64", "--spec-off-depth", "1000")
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60)


def metric_values(base) -> dict:
    text = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text  # ignored where no key is set
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + ("" if not sample.labels else json.dumps(sample.labels, sort_keys=True))
            values[key] = sample.value
    return values


def test_models_and_health(server, client, tiny_dirs):
    assert [m.id for m in client.models.list().data] == [str(tiny_dirs["chat"])]
    assert httpx.get(server + "/health").json()["status"] == "ok"


def test_completion_with_speculation_stats(client):
    out = client.completions.create(model=client.models.list().data[0].id, prompt="abc abc abc ab", max_tokens=12,
                                    temperature=0, extra_body={"gamma": 3})
    assert out.choices[0].finish_reason in ("length", "stop")
    assert out.usage.completion_tokens <= 12 and out.usage.prompt_tokens == 14
    spec = out.model_extra["speculation"]
    assert spec["enabled"] and spec["drafted"] >= spec["accepted"] >= 0 and spec["target_calls"] >= 1


def test_completion_stream_matches_non_stream(client):
    kwargs = dict(model=client.models.list().data[0].id, prompt="the cat the cat", max_tokens=15, temperature=0.9,
                  seed=5, extra_body={"gamma": 2})
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert "speculation" in chunks[-1].model_extra


def test_chat_stream_and_non_stream(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    out = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=10,
                                         temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.model_extra["speculation"]["target_calls"] >= 1
    stream = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=10,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == out.choices[0].message.content


def test_stop_sequence(client):
    model = client.models.list().data[0].id
    full = client.completions.create(model=model, prompt="abcabc", max_tokens=30, temperature=0).choices[0].text
    stop = full[5:7]
    cut = client.completions.create(model=model, prompt="abcabc", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_metrics_counters_move(server, client):
    before = metric_values(server)
    client.completions.create(model=client.models.list().data[0].id, prompt="abc abc", max_tokens=8, temperature=0)
    after = metric_values(server)
    assert after["specdec_generated_tokens_total"] > before.get("specdec_generated_tokens_total", 0)
    assert after["specdec_target_calls_total"] > before.get("specdec_target_calls_total", 0)
    assert "specdec_queue_depth" in after and "specdec_time_per_token_seconds_count" in after
    assert any(k.startswith("specdec_requests_total") for k in after)
    for histogram in ("queue_wait", "time_to_first_token", "request"):
        name = f"specdec_{histogram}_seconds_count"
        assert after[name] > before.get(name, 0), name
    assert after["specdec_prompt_tokens_total"] > before.get("specdec_prompt_tokens_total", 0)
    assert "specdec_requests_running" in after and "specdec_requests_waiting" in after
    assert any(k.startswith("specdec_generated_tokens_by_drafter_total{") for k in after)


BAD = [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-17"}, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "context"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 17}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "token ids"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}, 400, "token id"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"\u00b2": 1}}, 400, "token ids"),  # isdigit() but not int()
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1" * 5000: 1}}, 400, "token ids"),  # past int()'s digit limit
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, "finite"),
    ("/v1/completions", b'{"prompt": "x", "top_p": Infinity}', 400, "finite"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 3}, 400, "frequency_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "   "}, 400, "empty"),
    ("/v1/completions", {"prompt": "x" * 2_000_000}, 413, "larger than"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD)
def test_bad_input_gets_openai_error(server, path, body, status, needle):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server + path, content=content, headers={"Authorization": f"Bearer {KEY}",
                                                            "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["type"]


def test_api_key_required(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    for wrong in ("Bearer nope", f"Basic {KEY}", KEY, f"Bearer{KEY}"):
        assert httpx.get(server + "/v1/models", headers={"Authorization": wrong}).status_code == 401, wrong
    for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive (RFC 9110 11.1)
        assert httpx.get(server + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200


def test_load_8_clients_200_requests_no_loss_no_crosstalk(client):
    """Each request's output equals its own seeded output computed alone beforehand."""
    model = client.models.list().data[0].id
    prompts = ["abc abc ab", "the cat the", "hello hello", "a b a b a"]

    def ask(i):
        return client.completions.create(model=model, prompt=prompts[i % 4], max_tokens=16, temperature=1.0, seed=i,
                                         extra_body={"gamma": 3}).choices[0].text

    expected = [ask(i) for i in range(200)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(ask, range(200), timeout=300))
    assert len(got) == 200  # none lost or hung (map would raise on a timeout or error)
    assert got == expected  # none crossed


def test_queue_full_429_and_disconnect_frees_slot(tiny_dirs):
    proc, base = start_server(tiny_dirs["long"], "--max-queue", "2", "--spec-off-depth", "1")
    try:
        long_body = {"prompt": "abc", "max_tokens": 6000, "temperature": 1.0, "stream": True, "ignore_eos": True}
        # A streaming client that leaves after the first chunk: its generation must stop.
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", base + "/v1/completions", json=long_body) as r:
                assert r.status_code == 200
                next(r.iter_lines())
        deadline = time.time() + 30
        while time.time() < deadline and httpx.get(base + "/health").json()["queue_depth"] > 0:
            time.sleep(0.2)
        assert httpx.get(base + "/health").json()["queue_depth"] == 0
        values = metric_values(base)
        assert values["specdec_requests_cancelled_total"] >= 1
        assert values["specdec_generated_tokens_total"] < 6000

        # Fill the queue (2 slots) with long generations; the next request gets 429 + Retry-After.
        results = {}

        def long_request(i):
            results[i] = httpx.post(base + "/v1/completions", json={**long_body, "stream": False, "max_tokens": 3000},
                                    timeout=120)

        threads = [threading.Thread(target=long_request, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while time.time() < deadline and httpx.get(base + "/health").json()["queue_depth"] < 2:
            time.sleep(0.05)
        r = httpx.post(base + "/v1/completions", json={"prompt": "abc", "max_tokens": 4})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_exceeded"
        for t in threads:
            t.join()
        assert all(res.status_code == 200 for res in results.values())
        # both ran in one batch, which had reached --spec-off-depth: gamma=auto drafted nothing while they shared it
        values = metric_values(base)
        assert values["specdec_speculation_disabled_total"] >= 1
        assert values["specdec_batch_size_sum"] > values["specdec_batch_size_count"]  # some steps ran both
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- defects found by testing as users would: each against a real server process ----------------------


@pytest.fixture(scope="module")
def open_server(tiny_dirs):
    """No API key (the disconnect bug hid behind the middleware that was installed even without one)."""
    proc, base = start_server(tiny_dirs["long"], "--max-queue", "4", "--spec-off-depth", "1000")
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def wait_idle(base, seconds=10.0) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if httpx.get(base + "/health").json()["queue_depth"] == 0:
            return True
        time.sleep(0.1)
    return False


LONG = {"prompt": "abc", "max_tokens": 6000, "temperature": 1.0, "ignore_eos": True}


def test_non_streamed_request_stops_when_its_client_leaves(open_server):
    before = metric_values(open_server).get("specdec_generated_tokens_total", 0)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(open_server + "/v1/completions", json=LONG, timeout=1.5)
    assert wait_idle(open_server, 8), "the generation went on after its client left"
    values = metric_values(open_server)
    assert values["specdec_requests_cancelled_total"] >= 1
    assert values["specdec_generated_tokens_total"] - before < 6000


def test_queued_request_whose_client_left_never_runs(open_server):
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", open_server + "/v1/completions", json={**LONG, "stream": True}) as first:
            lines = first.iter_lines()  # kept: dropping the iterator would close the connection
            next(lines)  # the first request runs and holds the model
            cancelled = metric_values(open_server).get("specdec_requests_cancelled_total", 0)
            assert httpx.get(open_server + "/health").json()["queue_depth"] == 1
            with pytest.raises(httpx.TimeoutException):  # the second waits in the queue, then its client leaves
                httpx.post(open_server + "/v1/completions", json=LONG, timeout=1.0)
            time.sleep(0.5)
            next(lines)  # still streaming
    assert wait_idle(open_server, 8)
    assert metric_values(open_server)["specdec_requests_cancelled_total"] - cancelled >= 2  # both, none ran to the end


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
@pytest.mark.parametrize("stream", [False, True])
def test_seed_out_of_range_is_a_400(open_server, seed, stream):
    r = httpx.post(open_server + "/v1/completions", json={"prompt": "abc", "seed": seed, "stream": stream})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text


@pytest.mark.parametrize("path,raw", [("/v1/completions", b'{"prompt": "ab\\ud800"}'),
                                      ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}')])
def test_lone_surrogate_is_a_400(open_server, path, raw):
    r = httpx.post(open_server + path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text


def test_usage_counts_tokens_through_the_stop_string(open_server):
    """The tiny model's tokenizer has one token per character, so the count is exact."""
    body = {"prompt": "abc abc ab", "max_tokens": 40, "temperature": 0, "gamma": 8, "ignore_eos": True}
    text = httpx.post(open_server + "/v1/completions", json=body).json()["choices"][0]["text"]
    stop = text[6:8]
    r = httpx.post(open_server + "/v1/completions", json={**body, "stop": stop}).json()
    cut = text.find(stop)
    assert r["choices"][0]["text"] == text[:cut]
    assert r["usage"]["completion_tokens"] == cut + len(stop), r


def test_metric_labels_stay_bounded(open_server):
    for i in range(20):
        httpx.get(open_server + f"/v1/random-{i}")
    text = httpx.get(open_server + "/metrics").text
    assert "random-" not in text and 'endpoint="other"' in text


@pytest.mark.parametrize("field,value", [("response_format", {"type": "json_object"}), ("echo", True),
                                         ("best_of", 2), ("tools", [{"type": "function"}]), ("suffix", "x")])
def test_parameters_that_would_change_the_answer_are_refused(open_server, field, value):
    r = httpx.post(open_server + "/v1/completions", json={"prompt": "abc", "max_tokens": 2, field: value})
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_harmless_parameters_pass(open_server):
    r = httpx.post(open_server + "/v1/completions", json={"prompt": "abc", "max_tokens": 2, "logprobs": None,
                                                           "presence_penalty": 0, "user": "u1",
                                                           "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text


def test_model_by_id(open_server, tiny_dirs):
    name = str(tiny_dirs["long"])
    assert httpx.get(open_server + f"/v1/models/{name}").json()["id"] == name
    r = httpx.get(open_server + "/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("body,param", [({"prompt": "x", "stop": 5}, "stop"), ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
                                        ({"prompt": "x", "stream": "yes"}, "stream"), ({"prompt": 7}, "prompt")])
def test_types_are_strict_and_param_names_the_field(open_server, body, param):
    r = httpx.post(open_server + "/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_chat_content_as_text_parts(open_server):
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]
    r = httpx.post(open_server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}],
                                                                "max_tokens": 3})
    assert r.status_code == 200, r.text
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    r = httpx.post(open_server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": image}]})
    assert r.status_code == 400 and "text content parts" in r.json()["error"]["message"]


def test_host_header_of_another_site_is_refused(open_server):
    r = httpx.get(open_server + "/v1/models", headers={"Host": "attacker.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(open_server + "/v1/models", headers={"Host": "localhost:8000"}).status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/docs", "/openapi.json", "/redoc", "/v1/models"])
def test_api_key_guards_every_endpoint_but_health(server, path):
    assert httpx.get(server + path).status_code == 401
    assert httpx.get(server + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(server + "/health").status_code == 200


def test_key_from_environment_cors_and_a_sequential_client_never_429(tiny_dirs, monkeypatch):
    """With one queue slot, a client that asks again as soon as its answer came is never refused:
    the slot is free before the answer is sent."""
    monkeypatch.setenv("SPECDEC_API_KEY", "env-key")
    proc, base = start_server(tiny_dirs["chat"], "--max-queue", "1", "--cors-origins", "http://ui.example")
    try:
        auth = {"Authorization": "Bearer env-key"}
        assert httpx.get(base + "/v1/models").status_code == 401
        r = httpx.get(base + "/v1/models", headers={**auth, "Origin": "http://ui.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"
        for i in range(12):
            r = httpx.post(base + "/v1/completions", json={"prompt": "abc", "max_tokens": 3, "seed": i}, headers=auth)
            assert r.status_code == 200, (i, r.text)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_seeded_request_is_the_same_streamed_or_not_with_or_without_speculation(open_server):
    """Drafter-invariant sampling: a seeded answer depends on the seed alone."""
    body = {"prompt": "abc abc ab", "max_tokens": 40, "temperature": 1.0, "seed": 1234, "ignore_eos": True}
    texts = [httpx.post(open_server + "/v1/completions", json={**body, "gamma": g}).json()["choices"][0]["text"]
             for g in (0, 1, 4, "auto")]
    streamed = ""
    with httpx.stream("POST", open_server + "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                streamed += json.loads(line[6:])["choices"][0]["text"]
    assert len(set(texts)) == 1 and streamed == texts[0], (texts, streamed)


def malformed_bodies(count: int, seed: int = 0):
    """Requests a careless or hostile client sends: wrong types, nesting, sizes, encodings, unknown
    fields, broken JSON; some are valid and get a 200."""
    import random

    rng = random.Random(seed)
    values = [None, True, False, 0, -1, 1.5, 2**70, -(2**70), float("nan"), "", "x", "5", "\ud800", "ä" * 50,
              float("inf"), float("-inf"), 1e308, "\u202e\u0000\ufeff", "\U0001f642" * 100, "\u00b2",
              [], [1, 2], ["a", None], {}, {"a": {"b": {"c": [1, {"d": None}]}}}, [[[[[]]]]], "x" * 5000,
              {"\u00b2": 1.0}, {"\u0663": 1.0}, {"1" * 5000: 1.0}, {"5": float("nan")}, {"5": 1e308}, {"-1": 1.0},
              {"99999999999": 1.0}, {"5": "1"}, {"5": None}]
    fields = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
              "gamma", "ignore_eos", "model", "logprobs", "logit_bias", "tools", "user", "max_completion_tokens",
              "unknown_field", "response_format"]
    for i in range(count):
        kind = i % 5
        if kind == 0:  # not JSON, or not UTF-8, or not an object
            yield rng.choice([b"{", b"", b"null", b"[]", b"42", b"\xff\xfe{}", b'{"prompt": "a"', b'"just a string"',
                              b'{"prompt": "\\ud800\\udc00x"}', b"{" * 200 + b"}" * 200])
            continue
        body = {"prompt": "abc"} if kind in (1, 2) else {"messages": [{"role": "user", "content": "hi"}]}
        for _ in range(rng.randint(1, 4)):
            body[rng.choice(fields)] = rng.choice(values)
        if kind == 4:  # malformed messages
            body["messages"] = rng.choice([[{"role": "robot", "content": "x"}], [{"content": "x"}], [None], "hi",
                                           [{"role": "user", "content": [{"type": "text"}]}],
                                           [{"role": "user", "content": rng.choice(values)}]])
        body.setdefault("max_tokens", 2) if rng.random() < 0.8 else None
        try:
            yield json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError):
            yield b"{}"


def test_fuzz_1000_malformed_requests_no_500(open_server):
    statuses = Counter()
    content_types = ["application/json"] * 8 + ["text/plain", "application/x-www-form-urlencoded", ""]
    with httpx.Client(timeout=30) as http:
        for i, raw in enumerate(malformed_bodies(1000)):
            path = "/v1/completions" if i % 5 in (1, 2) else "/v1/chat/completions"
            r = http.post(open_server + path, content=raw, headers={"Content-Type": content_types[i % len(content_types)]})
            statuses[r.status_code] += 1
            assert r.status_code < 500, (raw[:300], r.status_code, r.text[:300])
            if r.status_code != 200:
                assert "error" in r.json()
            elif r.headers["content-type"].startswith("text/event-stream"):
                assert '"error"' not in r.text and r.text.endswith("data: [DONE]\n\n"), r.text[-300:]
    assert statuses[400] > 500 and statuses[200] > 0, statuses
    after = httpx.post(open_server + "/v1/completions", json={"prompt": "abc", "max_tokens": 3}, timeout=30)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] >= 1


def stream_events(base: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", base + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_logprobs_streamed_or_not_cover_the_answer(open_server):
    body = {"prompt": "abc ab", "max_tokens": 12, "temperature": 0, "logprobs": 3, "ignore_eos": True}
    whole = httpx.post(open_server + "/v1/completions", json=body).json()
    entries = whole["choices"][0]["logprobs"]
    assert len(entries["tokens"]) == whole["usage"]["completion_tokens"] == 12
    assert "".join(entries["tokens"]) == whole["choices"][0]["text"]
    assert all(lp <= 0 for lp in entries["token_logprobs"]) and all(len(top) == 3 for top in entries["top_logprobs"])
    # greedy: each token is its own likeliest alternative
    assert all(max(top, key=top.get) == token for token, top in zip(entries["tokens"], entries["top_logprobs"]))
    streamed = [c["choices"][0]["logprobs"] for c in stream_events(open_server, "/v1/completions", body)]
    assert sum((part["tokens"] for part in streamed if part), []) == entries["tokens"]
    # the same numbers up to the rounding of passes over another number of rows (speculation differs by timing)
    assert sum((part["token_logprobs"] for part in streamed if part), []) == pytest.approx(entries["token_logprobs"],
                                                                                          abs=1e-4)
    chat = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 6, "logprobs": True, "top_logprobs": 2,
            "temperature": 0, "ignore_eos": True}
    content = httpx.post(open_server + "/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and all(len(e["top_logprobs"]) == 2 and e["bytes"] for e in content)
    plain = httpx.post(open_server + "/v1/completions", json={**body, "logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_n_choices_streamed_or_not(open_server):
    body = {"prompt": "abc ab", "max_tokens": 10, "temperature": 1.0, "seed": 77, "ignore_eos": True}
    one = httpx.post(open_server + "/v1/completions", json=body).json()
    three = httpx.post(open_server + "/v1/completions", json={**body, "n": 3}).json()
    texts = [c["text"] for c in sorted(three["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert texts[0] == one["choices"][0]["text"] and len(set(texts)) > 1  # choice 0 is the seed's; the others differ
    assert three["usage"]["completion_tokens"] == 30 and three["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    events = stream_events(open_server, "/v1/completions", {**body, "n": 3})
    streamed = ["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in range(3)]
    assert streamed == texts
    assert events[-1]["usage"]["completion_tokens"] == 30
    chat = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 4, "n": 2, "temperature": 1.0}
    assert len(httpx.post(open_server + "/v1/chat/completions", json=chat).json()["choices"]) == 2


def test_logit_bias_and_penalties_change_the_answer(open_server):
    body = {"prompt": "abc abc abc", "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    greedy = httpx.post(open_server + "/v1/completions", json=body).json()["choices"][0]
    first = greedy["logprobs"]["tokens"][0]
    with open_server_tokenizer(open_server) as encode:
        banned = encode(first)
    biased = httpx.post(open_server + "/v1/completions", json={**body, "logit_bias": {str(banned): -100}}).json()
    assert first not in biased["choices"][0]["logprobs"]["tokens"]
    penalised = httpx.post(open_server + "/v1/completions", json={**body, "frequency_penalty": 2.0,
                                                                   "presence_penalty": 2.0}).json()["choices"][0]
    assert penalised["text"] != greedy["text"]
    assert len(set(penalised["logprobs"]["tokens"])) > len(set(greedy["logprobs"]["tokens"]))


class open_server_tokenizer:
    """The tiny models' tokenizer: one id per character (tests/helpers.py)."""

    def __init__(self, base):
        from helpers import CHARS

        self.ids = {c: i for i, c in enumerate(CHARS)}

    def __enter__(self):
        return lambda text: self.ids[text]

    def __exit__(self, *exc):
        return False


def test_a_base_model_without_a_chat_template_serves_completions_and_refuses_chat(tiny_dirs):
    """A target without a chat template (the built-in gemma3-270m is one): /v1/chat/completions is a 400
    that names the endpoint to use, /v1/completions answers."""
    proc, base = start_server(tiny_dirs["target"])
    try:
        r = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 400 and "no chat template: use /v1/completions" in r.json()["error"]["message"], r.text
        r = httpx.post(base + "/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def open_streams(base: str, count: int, body: dict):
    """`count` streaming completions on threads; each result is (events after the first, ended with [DONE])."""
    results: list[dict] = [{} for _ in range(count)]
    started = threading.Barrier(count + 1)

    def one(i: int) -> None:
        events, done, first = [], False, True
        with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True, "seed": i}, timeout=120) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    events.append((time.monotonic(), json.loads(line[6:])))
                    if first:
                        first = False
                        started.wait(timeout=60)
            results[i].update(events=events, done=done, status=r.status_code, body=r.read()[:300] if first else b"")
        if first:  # no text came: do not leave the others waiting
            started.abort()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    try:
        started.wait(timeout=60)  # every stream has had its first text
    except threading.BrokenBarrierError:
        for t in threads:
            t.join(timeout=5)
        pytest.fail(f"not every stream started: {results}")
    return threads, results


@pytest.mark.parametrize("drain,max_tokens,reason", [(60, 400, "length"), (1, 6000, "abort")])
def test_sigterm_drains_the_streams_in_flight_and_exits_0(tiny_dirs, drain, max_tokens, reason):
    """SIGTERM (what systemd, Docker and Kubernetes send): stop listening, let the 8 streams in flight
    finish, each with its last chunk and [DONE], and exit 0; past --drain-timeout they end with
    finish_reason "abort"."""
    import signal

    proc, base = start_server(tiny_dirs["long"], "--max-batch", "8", "--drain-timeout", str(drain))
    try:
        body = {"prompt": "abc", "max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True}
        threads, results = open_streams(base, 8, body)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=90)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):  # the listener is closed
            httpx.get(base + "/health", timeout=2)
    finally:
        proc.kill()
    for result in results:
        assert result["status"] == 200 and result["done"], result.get("events", [])[-1:]
        last = result["events"][-1][1]
        assert last["choices"][0]["finish_reason"] == reason and last["usage"]["completion_tokens"] >= 1
        assert any(at > signalled for at, _ in result["events"])  # it was still running when the signal came
        text = "".join(event["choices"][0]["text"] for _, event in result["events"])
        assert text and (reason == "abort" or last["usage"]["completion_tokens"] == max_tokens)
