"""An optional remote layer of the tune cache: text records shared through a Redis server.

Why it exists: tuning a shape takes seconds per backend, and a fleet of identical machines (a CI
pool, a training cluster) would otherwise repeat the same measurements on every host. A Redis
server lets one machine's results serve them all.

Why it is cautious: the server is shared and may be written by other software, so what comes back
is never trusted.

- Values are plain UTF-8 text (the JSON records the local store validates); nothing read from the
  server is unpickled or evaluated.
- What is read is bounded: a value over MAX_VALUE_BYTES, or one that is not UTF-8, is treated as
  absent (one warning), so a planted blob cannot exhaust memory.
- Timeouts are short (REMOTE_TIMEOUT_S) and nothing is retried: the cache sits on the dispatcher's
  first call for a shape, and a slow server must not stall the user's program.
- A server that is unreachable, slow or answering errors costs one warning; the layer then turns
  itself off for the rest of the process and every later call is a free no-op.
- Keys are namespaced (KEY_PREFIX) so a server shared with other applications is not trampled.
"""

from __future__ import annotations

import threading
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

from .notices import warn_once

REMOTE_TIMEOUT_S = 0.25
MAX_VALUE_BYTES = 1_000_000
MAX_UPDATE_ATTEMPTS = 5
KEY_PREFIX = "opselect:"
SCHEMES = ("redis", "rediss", "unix")


def redact_url(url: str) -> str:
    """The URL as it may appear in a warning: no user or password, no query (redis-py also takes
    `?password=...` there)."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        if "@" in parts.netloc:
            host = "***@" + host
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "<unparsable redis URL>"


class RedisLayer:
    """One Redis server as a layer of the tune cache (see the module docstring for the rules).

    Build it with from_url. The interface never raises: get returns None and update does nothing
    once the layer is off (enabled is False).
    """

    def __init__(self, url: str, connection_kwargs: dict[str, Any]):
        self.url = url
        self.display_url = redact_url(url)
        self.enabled = True
        self._connection_kwargs = connection_kwargs
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> RedisLayer | None:
        """A layer for `redis://host:port/db`, `rediss://...` or `unix:///path?db=N`; None, with
        one warning, when redis-py is missing or the URL is malformed. Nothing is connected yet."""
        try:
            from redis.connection import parse_url
        except ImportError:
            warn_once("remote-missing-redis",
                      "a remote cache was asked for but the redis package is not installed "
                      "(pip install redis); carrying on with the local cache only")
            return None
        display = redact_url(url)
        problem = None
        try:
            scheme = urlsplit(url).scheme
            kwargs = parse_url(url)
        except (ValueError, TypeError) as exc:
            problem = str(exc)
        else:
            # redis-py quietly falls back to localhost:6379 for `redis://`; a URL naming no server
            # is a configuration mistake, not a request for the default.
            if scheme not in SCHEMES:
                problem = f"scheme must be one of {', '.join(s + '://' for s in SCHEMES)}"
            elif scheme == "unix" and not kwargs.get("path"):
                problem = "a unix:// URL needs a socket path"
            elif scheme != "unix" and not kwargs.get("host"):
                problem = "the URL names no host"
        if problem is not None:
            warn_once("remote-bad-url",
                      f"ignoring the malformed remote cache URL {display!r}: {problem}")
            return None
        return cls(url, kwargs)

    # -- the interface the layered store uses -------------------------------------------------

    def get(self, key: str) -> str | None:
        """The text stored under key, or None (absent, unreadable, or the layer is off)."""
        client = self._connected()
        if client is None:
            return None
        try:
            raw = client.getrange(KEY_PREFIX + key, 0, MAX_VALUE_BYTES)
        except Exception as exc:  # any failure of the server or the link turns the layer off
            self._turn_off("reading", exc)
            return None
        return self._decode(key, raw)

    def update(self, key: str, change: Callable[[str | None], str]) -> None:
        """Replace key's text with change(current text or None), atomically against other writers
        (WATCH/MULTI, up to MAX_UPDATE_ATTEMPTS tries). A value this layer would refuse to read is
        passed to change as None, so a good record overwrites garbage."""
        client = self._connected()
        if client is None:
            return
        from redis.exceptions import WatchError

        name = KEY_PREFIX + key
        try:
            with client.pipeline(transaction=True) as pipe:
                for _ in range(MAX_UPDATE_ATTEMPTS):
                    try:
                        pipe.watch(name)
                        current = self._decode(key, pipe.getrange(name, 0, MAX_VALUE_BYTES))
                        new_text = self._changed(key, change, current)
                        if new_text is None:
                            return
                        pipe.multi()
                        pipe.set(name, new_text.encode("utf-8"))
                        pipe.execute()
                        return
                    except WatchError:
                        continue  # another writer got in between: read its value and merge again
                    finally:
                        pipe.reset()
            warn_once(f"remote-contended:{self.display_url}",
                      f"gave up writing {key!r} to the remote cache {self.display_url} after "
                      f"{MAX_UPDATE_ATTEMPTS} conflicting writes by other processes")
        except Exception as exc:  # any failure of the server or the link turns the layer off
            self._turn_off("writing", exc)

    def close(self) -> None:
        """Drop the connections; the layer is off afterwards."""
        with self._lock:
            client, self._client = self._client, None
            self.enabled = False
        if client is not None:
            try:
                client.close()
            except Exception:
                pass  # closing a dead link has nothing left to tell the user

    # -- internals ----------------------------------------------------------------------------

    def _connected(self) -> Any:
        """The client, created on first use (so configuring a layer never touches the network);
        None once the layer is off."""
        if not self.enabled:
            return None
        with self._lock:
            if self._client is None and self.enabled:
                try:
                    import redis
                    from redis.backoff import NoBackoff
                    from redis.retry import Retry

                    self._client = redis.Redis(
                        **self._connection_kwargs,
                        socket_connect_timeout=REMOTE_TIMEOUT_S,
                        socket_timeout=REMOTE_TIMEOUT_S,
                        retry=Retry(NoBackoff(), 0),  # no retries: one failure is enough
                        health_check_interval=0,
                        # Bytes back, so the size and UTF-8 checks happen here, on our terms.
                        decode_responses=False,
                    )
                except Exception as exc:
                    self.enabled = False
                    warn_once(f"remote-off:{self.display_url}",
                              f"the remote cache {self.display_url} is off for this process: "
                              f"could not create a client ({type(exc).__name__}: {exc})")
            return self._client if self.enabled else None

    def _decode(self, key: str, raw: Any) -> str | None:
        # GETRANGE reads at most MAX_VALUE_BYTES + 1 bytes: one byte more than allowed is enough
        # to know the value is too big without transferring the rest of it. A missing key reads
        # as b"", the same as an empty value, and no valid record is empty.
        if not isinstance(raw, (bytes, bytearray)) or not raw:
            return None
        if len(raw) > MAX_VALUE_BYTES:
            warn_once(f"remote-oversize:{self.display_url}",
                      f"ignoring the remote cache value for {key!r} at {self.display_url}: "
                      f"larger than {MAX_VALUE_BYTES} bytes")
            return None
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            warn_once(f"remote-not-text:{self.display_url}",
                      f"ignoring the remote cache value for {key!r} at {self.display_url}: "
                      "not UTF-8 text")
            return None

    def _changed(self, key: str, change: Callable[[str | None], str],
                 current: str | None) -> str | None:
        """change's new text, or None (nothing to write) when it failed or gave something this
        layer would refuse to read back. A failing merge is the caller's record problem, not
        the server's, so the layer stays on."""
        try:
            new_text = change(current)
        except Exception as exc:
            warn_once(f"remote-merge:{self.display_url}",
                      f"could not merge into the remote cache value for {key!r} "
                      f"({type(exc).__name__}: {exc}); left it unchanged")
            return None
        if not isinstance(new_text, str) or not new_text:
            warn_once(f"remote-merge:{self.display_url}",
                      f"not writing {key!r} to the remote cache: the new value is not text")
            return None
        if len(new_text.encode("utf-8")) > MAX_VALUE_BYTES:
            warn_once(f"remote-oversize-write:{self.display_url}",
                      f"not writing {key!r} to the remote cache: larger than "
                      f"{MAX_VALUE_BYTES} bytes")
            return None
        return new_text

    def _turn_off(self, doing: str, exc: BaseException) -> None:
        self.enabled = False
        warn_once(f"remote-off:{self.display_url}",
                  f"the remote cache {self.display_url} is off for this process: {doing} failed "
                  f"({type(exc).__name__}: {exc})")
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass  # the link is already broken; the warning above said so
