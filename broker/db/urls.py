"""``DATABASE_URL``: libpq's connection URI, multi-host included, read into Django's ``DATABASES``
entry, and written back out as a URL (child processes) or a JDBC URL (the Spark pipeline).

    postgres[ql]://[user[:password]@][host[:port][,host[:port]...]][/dbname][?param=value&...]

Every host of the list is tried in turn (libpq's multi-host form, how a primary and its standbys
are reached: ``?target_session_attrs=read-write`` skips the read-only ones), and any libpq
connection parameter may follow in the query string (``sslmode``, ``connect_timeout``,
``keepalives_idle``, ...): they go to psycopg (libpq) unchanged, on every connection the broker
opens. A URL that cannot be used is refused with one line naming the part (``DatabaseUrlError``);
the password never appears in it.

``LIBPQ_DEFAULTS`` bound the time a dead or silent database can hold a connection when the URL
does not say otherwise (docs/high-availability.md): connecting gives up after ``connect_timeout``
per host, an idle connection whose peer vanished is found by TCP keepalives, and data the peer
never acknowledges breaks the connection after ``tcp_user_timeout``.

Pure functions (no Django, no database): importable before the settings, by ``broker.embedded_db``
and the entry points, and tested without PostgreSQL (tests/broker/unit/test_db_urls.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import psycopg

SCHEMES = ("postgres", "postgresql")
DEFAULT_PORT = 5432
# libpq parameters added unless the URL names them: connect_timeout is per host (seconds);
# keepalives find a dead peer of an idle connection in idle + interval * count (19 s);
# tcp_user_timeout (milliseconds) breaks a connection whose sent data stays unacknowledged.
LIBPQ_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "3",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}
# Parameters whose values libpq reads as integers / from a fixed set (checked here so a typo fails
# at start-up, not at the first connection).
_INTEGERS = {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
             "tcp_user_timeout"}
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
}
# What the URI's own parts hold; the query string may set them too (libpq: the query wins).
_PARTS = ("host", "port", "user", "password", "dbname")
# target_session_attrs -> the JDBC driver's targetServerType
_JDBC_TARGETS = {"any": "any", "read-write": "primary", "primary": "primary", "read-only": "secondary",
                 "standby": "secondary", "prefer-standby": "preferSecondary"}


class DatabaseUrlError(ValueError):
    """A DATABASE_URL the broker cannot use; the message is one line naming the refused part."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"DATABASE_URL: {detail}")


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed URL: hosts in the order they are tried, each with its port (None: 5432)."""

    hosts: tuple[tuple[str, int | None], ...]
    dbname: str
    user: str = ""
    password: str = ""
    params: dict[str, str] = field(default_factory=dict)  # the other libpq parameters, as given


def libpq_keywords() -> frozenset[str]:
    """Every connection parameter the libpq psycopg runs on knows (no connection is made)."""
    return frozenset(option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults())


def _port(text: str, host: str) -> int | None:
    if text == "":
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise DatabaseUrlError(f"port {text!r} of host {host!r} is not a port number (1-65535)")
    return int(text)


def _host_port(item: str) -> tuple[str, int | None]:
    """One ``host[:port]`` of the host list (``[v6 address]:port`` for IPv6)."""
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            raise DatabaseUrlError(f"host {item!r} opens '[' without closing it")
        host, rest = item[1:end], item[end + 1:]
        if rest and not rest.startswith(":"):
            raise DatabaseUrlError(f"host {item!r} has {rest!r} after its address")
        return host, _port(rest[1:], host)
    host, sep, port = item.rpartition(":")
    if not sep:
        return unquote(item), None
    return unquote(host), _port(port, unquote(host))


def _query(text: str, known: frozenset[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for pair in text.split("&") if text else ():
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        key, value = unquote(key), unquote(value.replace("+", " "))
        if not sep:
            raise DatabaseUrlError(f"query parameter {key!r} has no value ({key}=...)")
        if key not in known:
            raise DatabaseUrlError(f"query parameter {key!r} is not a libpq connection parameter")
        if key in params:
            raise DatabaseUrlError(f"query parameter {key!r} is given twice")
        params[key] = value
    return params


def _check_values(params: Mapping[str, str]) -> None:
    for key, value in params.items():
        if key in _INTEGERS and not (value.lstrip("-").isdigit() and int(value) >= 0):
            raise DatabaseUrlError(f"{key}={value!r} is not a whole number >= 0")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise DatabaseUrlError(f"{key}={value!r} is not one of {', '.join(_CHOICES[key])}")


def database_url_parse(url: str, *, known: frozenset[str] | None = None) -> DatabaseUrl:
    """``url`` read as libpq reads a URI (percent-decoding each part); raises DatabaseUrlError."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise DatabaseUrlError("is not a URL (postgres://user:password@host:port/dbname)")
    if scheme.lower() not in SCHEMES:
        raise DatabaseUrlError(f"scheme {scheme!r} is not PostgreSQL's (postgres:// or postgresql://)")
    if "#" in rest:
        raise DatabaseUrlError("has a fragment ('#'); percent-encode '#' in a password as %23")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        userinfo, hostlist = "", netloc
    user, _, password = userinfo.partition(":")
    hosts: list[tuple[str, int | None]] = []
    if hostlist:
        items = hostlist.split(",")
        for i, item in enumerate(items):
            if item == "" or item.startswith(":"):
                raise DatabaseUrlError(f"host {i + 1} of {len(items)} in {hostlist!r} is empty")
            hosts.append(_host_port(item))
    params = _query(query, libpq_keywords() if known is None else known)
    parts = {"user": unquote(user), "password": unquote(password), "dbname": unquote(path) if slash else ""}
    for key in ("user", "password", "dbname"):
        if key in params:
            parts[key] = params.pop(key)
    if "host" in params or "port" in params:
        hosts = _query_hosts(params.pop("host", None), params.pop("port", None), hosts)
    if not parts["dbname"]:
        raise DatabaseUrlError("names no database (postgres://host:port/dbname)")
    _check_values(params)
    return DatabaseUrl(hosts=tuple(hosts), dbname=parts["dbname"], user=parts["user"], password=parts["password"],
                       params=params)


def _query_hosts(host: str | None, port: str | None, hosts: list) -> list[tuple[str, int | None]]:
    """``?host=...&port=...`` (libpq's other spelling, e.g. a unix socket folder): they replace the
    URI's hosts / ports; a port list is one port for all hosts or one per host."""
    names = host.split(",") if host is not None else [h for h, _ in hosts] or [""]
    if port is None:
        ports = [p for _, p in hosts] if len(hosts) == len(names) else [None] * len(names)
    else:
        raw = port.split(",")
        if len(raw) not in (1, len(names)):
            raise DatabaseUrlError(f"port={port!r} names {len(raw)} ports for {len(names)} hosts")
        ports = [_port(p, names[min(i, len(names) - 1)]) for i, p in enumerate(raw)]
        ports = ports * len(names) if len(ports) == 1 else ports
    return list(zip(names, ports))


def django_database(url: str, *, defaults: Mapping[str, str] = LIBPQ_DEFAULTS) -> dict:
    """Django's ``DATABASES`` entry for ``url``: HOST and PORT as libpq's comma-separated lists (one
    port per host), every other libpq parameter in OPTIONS, with ``defaults`` beneath them."""
    parsed = database_url_parse(url)
    hosts = [h for h, _ in parsed.hosts]
    ports = [p for _, p in parsed.hosts]
    return {
        "ENGINE": "broker.db.backend",
        "NAME": parsed.dbname,
        "USER": parsed.user,
        "PASSWORD": parsed.password,
        "HOST": ",".join(hosts),
        "PORT": "" if all(p is None for p in ports) else ",".join(str(p or DEFAULT_PORT) for p in ports),
        "OPTIONS": {**defaults, **parsed.params},
    }


def hosts_of(settings_dict: Mapping) -> list[tuple[str, int]]:
    """(host, port) pairs of a Django database entry, in the order they are tried."""
    hosts = str(settings_dict.get("HOST") or "").split(",")
    ports = [p for p in str(settings_dict.get("PORT") or "").split(",")]
    if len(ports) == 1:
        ports = ports * len(hosts)
    return [(h, int(p) if p else DEFAULT_PORT) for h, p in zip(hosts, ports)]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else quote(host, safe="")


def database_url_render(settings_dict: Mapping, *, dbname: str | None = None,
                        params: Mapping[str, str] | None = None) -> str:
    """The URL of a Django database entry (every host, the OPTIONS the URL gave): what a child
    process is handed as DATABASE_URL (``dbname`` replaces the database's name)."""
    auth = quote(str(settings_dict.get("USER") or ""), safe="")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(str(settings_dict["PASSWORD"]), safe="")
    hosts = ",".join(f"{_url_host(h)}:{p}" for h, p in hosts_of(settings_dict)) if settings_dict.get("HOST") else ""
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in (params or {}).items())
    name = quote(dbname or str(settings_dict["NAME"]), safe="")
    return f"postgres://{auth + '@' if auth else ''}{hosts}/{name}" + (f"?{query}" if query else "")


def jdbc_url(settings_dict: Mapping, *, params: Mapping[str, str]) -> str:
    """The PostgreSQL JDBC driver's URL for a Django database entry: every host, in order
    (``jdbc:postgresql://h1:p1,h2:p2/db``); ``target_session_attrs`` becomes ``targetServerType``,
    ``connect_timeout`` ``connectTimeout``, keepalives ``tcpKeepAlive``, ``sslmode`` is kept;
    ``params`` are the driver's own (ApplicationName, prepareThreshold, options, ...)."""
    hosts = [(h or "localhost", p) for h, p in hosts_of(settings_dict)]  # (libpq's default would be a socket)
    if any(h.startswith("/") for h, _ in hosts):
        raise DatabaseUrlError("JDBC needs TCP hosts, not a unix socket folder: name the host in DATABASE_URL")
    opts = settings_dict.get("OPTIONS") or {}
    query = dict(params)
    if opts.get("target_session_attrs") in _JDBC_TARGETS:
        query["targetServerType"] = _JDBC_TARGETS[opts["target_session_attrs"]]
    if opts.get("connect_timeout"):
        query["connectTimeout"] = str(opts["connect_timeout"])
    if str(opts.get("keepalives", "1")) != "0":
        query["tcpKeepAlive"] = "true"
    if opts.get("sslmode"):
        query["sslmode"] = opts["sslmode"]
    text = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items())
    hostlist = ",".join(f"{_url_host(h)}:{p}" for h, p in hosts)
    return f"jdbc:postgresql://{hostlist}/{quote(str(settings_dict['NAME']), safe='')}" + (f"?{text}" if text else "")


def options_settings(options: str) -> set[str]:
    """The server settings a libpq ``options`` string sets (``-c name=value`` / ``--name=value``):
    a URL that sets one keeps it over the broker's defaults."""
    words = options.split()
    names = set()
    for i, word in enumerate(words):
        if word == "-c" and i + 1 < len(words):
            names.add(words[i + 1].partition("=")[0])
        elif word.startswith("-c") and len(word) > 2:
            names.add(word[2:].partition("=")[0])
        elif word.startswith("--"):
            names.add(word[2:].partition("=")[0].replace("-", "_"))
    return names
