"""The callback address policy (BROKER_CALLBACK_DENY_PRIVATE / BROKER_CALLBACK_ALLOW), without a
database or DNS: which literal addresses are refused, the allow list, and the registration check
of URLs whose host is an address."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import netpolicy
from broker.netpolicy import CallbackDenied, address_denied, addresses_check, callback_url_check


@pytest.fixture(autouse=True)
def _policy(settings):
    settings.BROKER_CALLBACK_DENY_PRIVATE = True
    settings.BROKER_CALLBACK_ALLOW = ""


DENIED = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "224.0.0.1",
          "100.64.0.1", "255.255.255.255", "::1", "::", "fe80::1%eth0", "fc00::1", "ff02::1",
          "::ffff:10.0.0.1", "::ffff:127.0.0.1", "2002:0a00:0001::", "[::1]", "not-an-address", ""]
ALLOWED = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", DENIED)
def test_private_and_special_addresses_are_denied(address):
    assert address_denied(address)


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address):
    assert not address_denied(address)


def test_the_allow_list_takes_names_addresses_and_networks(settings):
    settings.BROKER_CALLBACK_ALLOW = " receiver.internal. , 10.1.2.0/24,[::1], 127.0.0.1 ,"
    assert not address_denied("10.1.2.200") and address_denied("10.1.3.1")
    assert not address_denied("::1") and not address_denied("127.0.0.1")
    assert not address_denied("::ffff:10.1.2.5"), "an IPv4-mapped form is its IPv4 address"
    assert addresses_check("Receiver.Internal", ["10.9.9.9"]) == ["10.9.9.9"], "an allowed name skips the check"


def test_one_private_answer_refuses_the_whole_name():
    assert addresses_check("public.example", ["8.8.8.8"]) == ["8.8.8.8"]
    with pytest.raises(CallbackDenied, match="10.0.0.1 of mixed.example"):
        addresses_check("mixed.example", ["8.8.8.8", "10.0.0.1"])


def test_policy_off_allows_everything(settings):
    settings.BROKER_CALLBACK_DENY_PRIVATE = False
    assert not netpolicy.enabled()
    assert addresses_check("h", ["127.0.0.1"]) == ["127.0.0.1"]
    callback_url_check("http://127.0.0.1/x")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/cb", "https://[::1]/cb", "http://169.254.169.254/latest",
                                 "http://10.0.0.1:99999/cb", "http://[::ffff:192.168.0.1]/"])
def test_registration_refuses_urls_naming_denied_addresses(url):
    with pytest.raises(CallbackDenied):
        callback_url_check(url)


@pytest.mark.parametrize("url", ["http://8.8.8.8/cb", "https://[2606:4700:4700::1111]:8443/cb", "not a url", ""])
def test_registration_passes_public_addresses_and_leaves_hostless_urls_to_validation(url):
    callback_url_check(url)


def test_callback_denied_is_a_failed_connection():
    assert issubclass(CallbackDenied, OSError)


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_is_denied_unless_global_unicast(ip):
    assert address_denied(str(ip)) == (not ip.is_global or ip.is_multicast)


@given(st.ip_addresses(v=4))
def test_ipv4_wrapped_in_ipv6_is_judged_as_the_ipv4_address(ip):
    assert address_denied(f"::ffff:{ip}") == address_denied(str(ip))
    if address_denied(str(ip)):
        sixtofour = ipaddress.IPv6Address((0x2002 << 112) | (int(ip) << 80))
        assert address_denied(str(sixtofour)), "6to4 carrying a denied IPv4 address"
