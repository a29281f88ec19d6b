"""Which addresses the broker may call back: ``BROKER_CALLBACK_DENY_PRIVATE`` and ``BROKER_CALLBACK_ALLOW``.

A consumer chooses its callback URL, so without a policy anyone with the admin token (or a seed
file) could make the broker POST into its own network: loopback, private ranges, link-local (the
cloud metadata service at 169.254.169.254), multicast, unspecified, their IPv6 forms and IPv4
addresses wrapped in IPv6 (``::ffff:10.0.0.1``). With the deny on (the default outside DEBUG):

- registration (consumer PUT, admin form, seed file) refuses such a URL, also when its host name
  resolves to such an address (400 ``callback_url_not_allowed``);
- the push client checks again when it opens a connection, on the addresses it is about to
  connect to (a DNS answer can change after registration: rebinding), and connects to the
  checked address itself; a denied one is a failed attempt with a clear error.

``BROKER_CALLBACK_ALLOW``: comma-separated host names, addresses and CIDR networks that are
allowed even though private (e.g. ``receiver.internal,10.1.2.0/24``).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from urllib.parse import urlsplit

from django.conf import settings

RESOLVE_TIMEOUT = 3.0  # seconds a registration waits for DNS; unresolvable names are checked at delivery
_resolver = ThreadPoolExecutor(max_workers=2, thread_name_prefix="callback-dns")


class CallbackDenied(OSError):
    """The callback's address is refused by the policy (an OSError: a failed connection attempt)."""


def enabled() -> bool:
    return bool(getattr(settings, "BROKER_CALLBACK_DENY_PRIVATE", False))


@functools.lru_cache(maxsize=16)
def _allow_list(raw: str) -> tuple[frozenset, tuple]:
    names, networks = set(), []
    for entry in raw.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry.rstrip("."))
    return frozenset(names), tuple(networks)


def _allowed() -> tuple[frozenset, tuple]:
    return _allow_list(getattr(settings, "BROKER_CALLBACK_ALLOW", "") or "")


def _private(ip) -> bool:
    return (not ip.is_global or ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
            or ip.is_unspecified or ip.is_reserved or getattr(ip, "is_site_local", False))


def address_denied(address: str) -> bool:
    """Whether the policy refuses to call this IP address (a literal; scope ids are ignored)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return True  # not an address we can reason about: refuse
    forms = [ip]
    if ip.version == 6 and ip.ipv4_mapped is not None:
        forms = [ip.ipv4_mapped]  # ::ffff:a.b.c.d is a.b.c.d on a dual-stack socket
    elif ip.version == 6:  # IPv4 inside 6to4 and Teredo addresses counts too
        forms += [e for e in (ip.sixtofour, ip.teredo[1] if ip.teredo else None) if e is not None]
    _, networks = _allowed()
    if any(form in net for form in forms for net in networks if form.version == net.version):
        return False
    return any(_private(form) for form in forms)


def host_allowed_by_name(host: str) -> bool:
    names, _ = _allowed()
    return host.lower().rstrip(".") in names


def addresses_check(host: str, addresses: list[str]) -> list[str]:
    """The addresses to connect to for ``host``; CallbackDenied when the policy refuses any of
    them (a name answering with one public and one private address is refused as a whole)."""
    if not enabled() or host_allowed_by_name(host):
        return addresses
    denied = [a for a in addresses if address_denied(a)]
    if denied:
        raise CallbackDenied(f"callback address {denied[0]} of {host} is not allowed "
                             "(BROKER_CALLBACK_DENY_PRIVATE; see BROKER_CALLBACK_ALLOW)")
    return addresses


def callback_url_check(url: str) -> None:
    """Registration-time check of a callback URL (CallbackDenied when refused). Host names are
    resolved (bounded wait); one that does not resolve now is left to the delivery-time check."""
    if not enabled():
        return
    parts = urlsplit(url)
    host = (parts.hostname or "").strip()
    if not host or host_allowed_by_name(host):
        return
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        addresses = [host]
    except ValueError:
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = 80
        future = _resolver.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            addresses = sorted({info[4][0] for info in future.result(timeout=RESOLVE_TIMEOUT)})
        except (OSError, UnicodeError, FutureTimeout, ValueError):
            return
    addresses_check(host, addresses)
