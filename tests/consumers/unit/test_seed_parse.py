"""The INI seed file (webhook-broker's format) parsed into a plan, without a database: what is
kept, what is skipped with an error, and that nothing raises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumers.seed import seed_parse

FULL = """
[initial-channels]
ch1 = Channel One
ch2 =
[initial-channel-tokens]
ch1 = ct1
ch2 = ct2
[initial-producers]
p1 = Producer
p2 = P2
[initial-producer-tokens]
p1 = pt1
p2 = pt2
[initial-producer-rate-limits]
p1 = 50, 10
p2 = fast
[initial-consumers]
push1 = https://example.com/hook
pull1 =
bell = http://example.com/bell
[push1]
token = t1
channel = ch1
maxInFlight = 0
maxDeliveriesPerSecond = 2.5
ordered = yes
[pull1]
token = t2
channel = ch2
type = pull
maxAckPending = 7
maxQueued = 100
[bell]
token = t3
channel = ch1
type = pull
notifyInterval = 15
"""


def test_a_full_file():
    plan = seed_parse(FULL)
    assert plan.channels == {"ch1": {"name": "Channel One", "token": "ct1"}, "ch2": {"name": "ch2", "token": "ct2"}}
    assert plan.producers["p1"] == {"name": "Producer", "token": "pt1", "rate_limit_per_second": 50.0, "burst": 10}
    assert plan.producers["p2"] == {"name": "P2", "token": "pt2"}
    assert plan.errors == ["producer p2: rate limit 'fast' is not rate[,burst], ignored"]
    assert plan.consumers["push1"] == {"channel": "ch1", "name": "push1", "token": "t1",
                                       "callback_url": "https://example.com/hook", "type": "push",
                                       "max_in_flight": 1, "max_deliveries_per_second": 2.5, "ordered": True}
    assert plan.consumers["pull1"] == {"channel": "ch2", "name": "pull1", "token": "t2", "callback_url": "",
                                       "type": "pull", "max_ack_pending": 7, "max_queued": 100}
    assert plan.consumers["bell"]["notify_interval"] == 15.0


def test_the_public_plan_and_digest_hold_no_tokens():
    plan = seed_parse(FULL)
    public = plan.public()
    assert "token" not in str(public) and public["consumers"]["push1"]["channel"] == "ch1"
    assert seed_parse(FULL).digest() == plan.digest()
    assert seed_parse(FULL.replace("ct1", "other")).digest() != plan.digest()


def _consumer(options: str, url: str = "https://example.com/hook") -> tuple[dict, list]:
    text = (f"[initial-channels]\nch1 = C\n[initial-channel-tokens]\nch1 = ct\n"
            f"[initial-consumers]\nc = {url}\n[c]\nchannel = ch1\ntoken = t\n{options}\n")
    plan = seed_parse(text)
    return plan.consumers, plan.errors


def test_skipped_consumers_each_with_its_error():
    cases = {
        "type = queue": "invalid type 'queue'",
        "ordered = maybe": "ordered must be true or false",
        "maxInFlight = many": "must be (positive) numbers",
        "notifyInterval = 0": "must be (positive) numbers",
        "token =": "no token",
        "channel = nope": "channel 'nope' is not a seeded channel",
    }
    for options, error in cases.items():
        consumers, errors = _consumer(options)
        assert consumers == {} and len(errors) == 1 and error in errors[0], (options, errors)
    for url, error in [("", "a push consumer needs a callback URL"), ("/relative", "is not absolute"),
                       ("ftp://h/x", "is not absolute")]:
        consumers, errors = _consumer("", url)
        assert consumers == {} and error in errors[0], (url, errors)


def test_tokenless_channels_and_producers_are_skipped():
    plan = seed_parse("[initial-channels]\nch = C\n[initial-producers]\np = P\n")
    assert plan.channels == {} and plan.producers == {}
    assert plan.errors == ["channel ch: no token in [initial-channel-tokens], skipped",
                           "producer p: no token in [initial-producer-tokens], skipped"]


def test_invalid_ini_is_an_error_not_an_exception():
    plan = seed_parse("no section header\n")
    assert plan.errors and plan.errors[0].startswith("invalid INI")


@given(st.text(max_size=300))
def test_any_text_parses_into_a_plan(text):
    plan = seed_parse(text)
    assert all(isinstance(e, str) for e in plan.errors)
    assert set(c["channel"] for c in plan.consumers.values()) <= set(plan.channels)
