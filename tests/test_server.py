"""A real `specdec serve` process on loopback, driven by the official openai client and raw HTTP."""

import json
import socket
import subprocess
import sys
import threading
import time
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
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--target", str(model_dir), "--dtype",
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
    text = httpx.get(base + "/metrics").text
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
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n=1"),
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
        # the second long request found a deep queue: served without speculation
        spec = [res.json()["speculation"]["enabled"] for res in results.values()]
        assert False in spec
        assert metric_values(base)["specdec_speculation_disabled_total"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
