"""Who may use `keras-transformer-serve`: the `Host` a request names and the `Origin` a
browser sends, each checked against an allow-list before any route runs.

    access = Access.local()                                  # localhost names only
    access = Access(hosts={"mt.example.com"}, origins={"https://app.example.com"})
    app = AccessCheck(app, access, error_response)           # ASGI middleware

Why: a web page the user opens can send a request to a server on localhost.
A POST with `Content-Type: text/plain` needs no CORS preflight, so without
these checks any page could translate through the server (and, with DNS
rebinding, a page whose own name resolves to 127.0.0.1 could read the
answers too). Browsers send `Origin` on every cross-origin POST; curl, TF
Serving's clients and `export/serving/client_rest.py` send none, so they
are not affected. A request is refused (403, TF Serving's JSON error) when
its `Host` is not allowed, or when it has an `Origin` that is neither
allowed nor the server's own (the page at `/` posts to the origin it came
from). Allowed cross-origin callers get CORS headers (Starlette's
`CORSMiddleware`), so a page of theirs can read the answers.
"""

import dataclasses
import urllib.parse

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclasses.dataclass(frozen=True)
class Access:
    """The allow-lists (lower-case; "*" allows any).

    Args:
        hosts: host names (no port) a request's `Host` header may name.
        origins: origins (`scheme://host[:port]`) allowed to call from a browser,
            besides the server's own.
    """

    hosts: frozenset = frozenset(LOCAL_HOSTS)
    origins: frozenset = frozenset()

    @classmethod
    def local(cls, bound="127.0.0.1"):
        return cls(frozenset(LOCAL_HOSTS) | {bound.lower()})

    @classmethod
    def of_flags(cls, host, allowed_hosts, allowed_origins):
        """The command line's: `--allowed-hosts` (default: localhost names and the bound
        address; required with a wildcard address, 0.0.0.0 or ::), `--allowed-origins`."""
        if allowed_hosts is None and host in ("0.0.0.0", "::", ""):
            raise ValueError(
                f"--host {host} listens on every address: give --allowed-hosts, the names "
                "clients use to reach this server (e.g. --allowed-hosts mt.example.com "
                "10.0.0.5), or '*' to accept any Host header."
            )
        hosts = set(LOCAL_HOSTS) | {host.lower()} if allowed_hosts is None else set()
        hosts |= {h.lower().strip("[]") for h in allowed_hosts or ()}
        origins = {o.lower().rstrip("/") for o in allowed_origins or ()}
        return cls(frozenset(hosts), frozenset(origins))

    def host_allowed(self, host):
        return "*" in self.hosts or _host_name(host) in self.hosts

    def origin_allowed(self, origin, host):
        """Whether a browser at `origin` may call: allowed, or the server's own."""
        origin = origin.lower().rstrip("/")
        if "*" in self.origins or origin in self.origins:
            return True
        parsed = urllib.parse.urlsplit(origin)
        return parsed.scheme in ("http", "https") and parsed.netloc == host.lower()


def _host_name(host):
    """The name of a `Host` header's value, without its port (`[::1]:8501` -> `::1`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class AccessCheck:
    """ASGI middleware: refuses (403) a request whose `Host` or `Origin` is not
    allowed, and adds CORS headers for the allowed origins."""

    def __init__(self, app, access, error_response):
        from starlette.middleware.cors import CORSMiddleware

        self.access = access
        self.error_response = error_response
        self.app = app
        if access.origins:
            self.app = CORSMiddleware(
                app, allow_origins=sorted(access.origins), allow_methods=["GET", "POST"],
                allow_headers=["Content-Type"], max_age=600,
            )  # fmt: skip

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {}
        for name, value in scope.get("headers", ()):
            if name in (b"host", b"origin"):
                headers.setdefault(name, value.decode("latin-1"))
        host, origin = headers.get(b"host", ""), headers.get(b"origin")
        message = None
        if not self.access.host_allowed(host):
            message = (
                f"Host {host[:80]!r} is not allowed: this server answers "
                f"{', '.join(sorted(self.access.hosts))} (--allowed-hosts)."
            )
        elif origin is not None and not self.access.origin_allowed(origin, host):
            message = (
                f"Origin {origin[:80]!r} is not allowed to call this server from a browser "
                "(--allowed-origins)."
            )
        if message is not None:
            await self.error_response(message, 403)(scope, receive, send)
            return
        await self.app(scope, receive, send)
