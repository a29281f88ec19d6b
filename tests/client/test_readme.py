"""The Python examples of client/README.md run as written against a real broker seeded with the
sample channel, producer and pull consumer that `make run` creates (BROKER_URL points them here)."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import requests
from standardwebhooks import Webhook

from tests.client.conftest import CLIENT_DIR, client_env
from tests.processes import free_port

EXAMPLES = re.findall(r"```python\n(.*?)```", (CLIENT_DIR / "README.md").read_text(), re.S)


def run(code: str, env, tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    return subprocess.Popen([sys.executable, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def sample_world(world):
    world.put("/channel/sample-channel", token="sample-channel-token")
    world.put("/producer/sample-producer", token="sample-producer-token")
    world.put("/channel/sample-channel/consumer/sample-pull-consumer", token="sample-pull-consumer-token", type="pull")


def sample_stats(world) -> dict:
    return world.admin.get(f"{world.url}/channel/sample-channel/consumer/sample-pull-consumer").json()


def test_the_readme_examples_run(world, tmp_path):
    assert len(EXAMPLES) == 4
    publish, consume, fetch, receiver = EXAMPLES
    sample_world(world)
    env = client_env(BROKER_URL=world.url)

    p = run(publish, env, tmp_path, "publish")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "published " in out and "3 created [] duplicates" in out and "refused: duplicate_message_id" in out

    p = run(consume, env, tmp_path, "consume")
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if sample_stats(world)["NumDelivered"] == 4:
                break
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert out.count("job ") == 4
    assert json.loads(out.strip().splitlines()[-1])["delivered"] == 4
    assert (sample_stats(world)["NumAckPending"], sample_stats(world)["NumDead"]) == (0, 0)

    from broker_client import Producer

    producer = Producer(world.url, "sample-channel", "sample-channel-token", "sample-producer", "sample-producer-token")
    producer.publish_batch(["a", "b"])
    p = run(fetch, env, tmp_path, "fetch")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "2 acknowledged; 0 pending"

    secret = "whsec_" + base64.b64encode(b"r" * 24).decode()
    port = free_port()
    p = run(receiver, client_env(PORT=port, SIGNING_SECRET=secret), tmp_path, "receiver")
    try:
        url = f"http://127.0.0.1:{port}/hook"
        end = time.monotonic() + 20
        while True:
            try:
                requests.get(url, timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < end, p.stderr.read() if p.poll() is not None else "receiver not up"
                time.sleep(0.1)
        body = b'{"n": 1}'
        stamp = datetime.now(timezone.utc)
        signature = Webhook(secret).sign("42", stamp, body.decode())
        headers = {"webhook-id": "42", "webhook-timestamp": str(int(stamp.timestamp())),
                   "webhook-signature": signature, "X-Broker-Message-ID": "m-1", "Content-Type": "application/json"}
        assert requests.post(url, data=body, headers=headers).status_code == 204
        assert requests.post(url, data=body + b" ", headers=headers).status_code == 401
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=10)
    assert "job 42 message m-1" in out
