"""The ``broker`` console script against a real broker, run as a user runs it (a child process):
publish from text, a file and stdin; tail with and without --ack; stats; settings from the
environment, from a --profile in a config file, and flags over both."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from tests.client.conftest import CHANNEL, CHANNEL_TOKEN, CONSUMER, CONSUMER_TOKEN, PRODUCER, PRODUCER_TOKEN, client_env


def cli(*args, env=None, stdin=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "broker_client", *args], env=env or client_env(), input=stdin,
                          capture_output=True, timeout=timeout)


def producer_env(world, **extra):
    return client_env(BROKER_URL=world.url, BROKER_CHANNEL_TOKEN=CHANNEL_TOKEN, BROKER_PRODUCER_ID=PRODUCER,
                      BROKER_PRODUCER_TOKEN=PRODUCER_TOKEN, BROKER_CONSUMER_TOKEN=CONSUMER_TOKEN, **extra)


def test_publish_tail_and_stats_from_the_environment(world, tmp_path):
    env = producer_env(world)
    r = cli("publish", CHANNEL, "--data", "hello", "--header", "X-Trace=t1", "--priority", "2", env=env)
    assert r.returncode == 0, r.stderr
    text_id = r.stdout.decode().strip()
    payload = tmp_path / "p.bin"
    payload.write_bytes(b"\xff\x00 file bytes")
    r = cli("publish", CHANNEL, "--data", f"@{payload}", "--message-id", "from-file", env=env)
    assert r.returncode == 0 and r.stdout.decode().strip() == "from-file", r.stderr
    r = cli("publish", CHANNEL, "--data", "-", "--content-type", "application/json", env=env, stdin=b'{"in": 1}')
    assert r.returncode == 0, r.stderr
    stdin_id = r.stdout.decode().strip()

    # without --ack: printed and left in flight (they come back after their deadline)
    r = cli("tail", CHANNEL, CONSUMER, "--count", "1", env=env)
    assert r.returncode == 0, r.stderr
    [line] = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert line["message_id"] == text_id and line["payload"] == "hello" and line["headers"] == {
        "X-Trace": "t1", "traceparent": line["headers"].get("traceparent")}  # issue 25: each message has a trace
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", line["headers"]["traceparent"])
    assert line["priority"] == 2 and line["attempt"] == 1 and isinstance(line["id"], str)
    assert world.stats()["NumAckPending"] == 1
    world.wait(lambda: world.stats()["NumPending"] == 3, what="the unacknowledged job back in the queue")

    r = cli("tail", CHANNEL, CONSUMER, "--ack", "--count", "3", "--batch", "2", env=env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert [x["message_id"] for x in lines] == [text_id, "from-file", stdin_id]
    assert lines[0]["attempt"] == 2 and lines[1]["payload_base64"] and lines[2]["payload"] == '{"in": 1}'
    s = world.stats()
    assert (s["NumDelivered"], s["NumAckPending"], s["NumPending"]) == (3, 0, 0)

    r = cli("tail", CHANNEL, CONSUMER, "--ack", "--wait", "0.5", env=env)  # nothing left: stops by itself
    assert r.returncode == 0 and r.stdout == b"", r.stderr

    r = cli("stats", CHANNEL, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["consumers"][CONSUMER]["DELIVERED"] == 3
    r = cli("stats", CHANNEL, CONSUMER, env=env)
    body = json.loads(r.stdout)
    assert r.returncode == 0 and body["NumDelivered"] == 3 and "Token" not in body and "SigningSecret" not in body
    r = cli("stats", CHANNEL, CONSUMER, env=client_env(BROKER_URL=world.url, BROKER_ADMIN_TOKEN="test-admin-token"))
    body = json.loads(r.stdout)
    assert r.returncode == 0 and body["NumDelivered"] == 3 and "Token" not in body and "SigningSecret" not in body


def test_profile_file_flags_and_errors(world, tmp_path):
    config = tmp_path / "broker.ini"
    config.write_text(f"[local]\nurl = {world.url}\nchannel_token = {CHANNEL_TOKEN}\nproducer_id = {PRODUCER}\n"
                      f"producer_token = {PRODUCER_TOKEN}\nconsumer_token = {CONSUMER_TOKEN}\n\n"
                      f"[broken]\nurl = {world.url}\nchannel_token = {CHANNEL_TOKEN}\nproducer_id = {PRODUCER}\n"
                      "producer_token = wrong\n")
    bare = client_env()
    r = cli("--profile", "local", "--config", str(config), "publish", CHANNEL, "--data", "via profile", env=bare)
    assert r.returncode == 0, r.stderr
    # options are accepted after the command too; the profile wins over the environment
    env = client_env(BROKER_URL="http://127.0.0.1:9", BROKER_CONFIG=str(config))
    r = cli("tail", CHANNEL, CONSUMER, "--ack", "--count", "1", "--profile", "local", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["payload"] == "via profile", r.stderr
    # the broker's refusal: exit 1 with its code
    r = cli("publish", CHANNEL, "--data", "x", "--profile", "broken", env=env)
    assert r.returncode == 1 and b"403 producer_token_mismatch" in r.stderr
    # a flag wins over the profile
    r = cli("publish", CHANNEL, "--data", "x", "--profile", "broken", "--producer-token", PRODUCER_TOKEN, env=env)
    assert r.returncode == 0, r.stderr
    # settings problems: exit 2 with what is missing
    r = cli("publish", CHANNEL, "--data", "x", "--profile", "nope", env=env)
    assert r.returncode == 2 and b"profile [nope] not found" in r.stderr
    r = cli("publish", CHANNEL, "--data", "x", env=client_env(BROKER_URL=world.url))
    assert r.returncode == 2 and b"BROKER_CHANNEL_TOKEN" in r.stderr
    r = cli("publish", CHANNEL, "--data", "x", "--retries", "0",
            env=client_env(BROKER_URL="http://127.0.0.1:9", BROKER_CHANNEL_TOKEN="a", BROKER_PRODUCER_ID="b",
                           BROKER_PRODUCER_TOKEN="c"))
    assert r.returncode == 1 and b"cannot reach the broker" in r.stderr


def test_the_console_script_is_installed():
    """``pip install ./client`` (make test does it) puts a ``broker`` script next to the interpreter."""
    [script] = [e for e in entry_points(group="console_scripts") if e.name == "broker"]
    assert script.value == "broker_client.cli:main"
    path = Path(sys.executable).parent / "broker"
    assert path.exists() or shutil.which("broker")
    r = subprocess.run([str(path), "--help"], capture_output=True, timeout=30)
    assert r.returncode == 0 and b"publish" in r.stdout and b"tail" in r.stdout and b"stats" in r.stdout
