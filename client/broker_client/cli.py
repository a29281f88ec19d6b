"""The ``broker`` console script: publish, tail a pull consumer, show statistics.

    broker publish CHANNEL --data @file|-|TEXT [--content-type T] [--message-id ID] ...
    broker tail CHANNEL CONSUMER [--ack] [--count N] [--group G]
    broker stats CHANNEL [CONSUMER]

Settings: flags, ``--profile NAME`` (config file), ``BROKER_URL`` / ``BROKER_*_TOKEN``, see
``broker_client.config``. Exit status: 0 done, 1 the broker refused (its error code is printed),
2 bad usage or missing settings, 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys

import requests

from broker_client.config import ConfigError, Settings, settings_load
from broker_client.consumer import PullConsumer
from broker_client.errors import BrokerError
from broker_client.http import RetryPolicy, Transport, path_segment
from broker_client.jobs import DELIVERED, Job
from broker_client.producer import Producer

SECRET_FIELDS = ("Token", "SigningSecret")


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the command (SUPPRESS: absent unless given)."""
    p = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    p.add_argument("--profile", help="section of the config file to use")
    p.add_argument("--config", help="config file (default $BROKER_CONFIG or ~/.config/broker-client/config.ini)")
    p.add_argument("--url", help="broker base URL ($BROKER_URL)")
    p.add_argument("--channel-token", help="$BROKER_CHANNEL_TOKEN")
    p.add_argument("--producer-id", help="$BROKER_PRODUCER_ID")
    p.add_argument("--producer-token", help="$BROKER_PRODUCER_TOKEN")
    p.add_argument("--consumer-token", help="$BROKER_CONSUMER_TOKEN")
    p.add_argument("--admin-token", help="$BROKER_ADMIN_TOKEN (stats only, when the tokens are not given)")
    p.add_argument("--retries", type=int, help="retries of 429/503/connection errors (default 5)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the client's retries and pins")
    return p


def parser_build() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="broker", parents=[common],
                                     description="Publish to and consume from the message broker.")
    commands = parser.add_subparsers(dest="command", required=True)

    pub = commands.add_parser("publish", parents=[common], help="publish one message; prints its id")
    pub.add_argument("channel")
    pub.add_argument("--data", required=True, help="@FILE, - (stdin) or the text itself")
    pub.add_argument("--content-type", default=None)
    pub.add_argument("--message-id", default=None, help="default: generated (and printed)")
    pub.add_argument("--priority", type=int, default=0)
    pub.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                     help="metadata header stored and forwarded to consumers (repeatable)")
    pub.add_argument("--type", dest="message_type", default=None, help="message type (X-Broker-Message-Type)")
    pub.add_argument("--partition-key", default=None)
    pub.add_argument("--gate", type=int, default=None)
    pub.add_argument("--at", dest="scheduled_for", default=None, metavar="RFC3339",
                     help="schedule for this time (e.g. 2030-01-02T03:04:05Z)")

    tail = commands.add_parser("tail", parents=[common], help="pull jobs and print them, one JSON object a line")
    tail.add_argument("channel")
    tail.add_argument("consumer")
    tail.add_argument("--ack", action="store_true",
                      help="acknowledge each printed job (without it, jobs come back after their deadline)")
    tail.add_argument("--count", type=int, default=None, help="stop after this many jobs")
    tail.add_argument("--batch", type=int, default=10)
    tail.add_argument("--expires", type=float, default=30.0, help="long-poll seconds per pull")
    tail.add_argument("--wait", type=float, default=None,
                      help="stop when a pull waited this long without a job (default: never)")
    tail.add_argument("--group", default=None)
    tail.add_argument("--payload-only", action="store_true", help="print only each payload (as text)")

    stats = commands.add_parser("stats", parents=[common], help="message and job counts of a channel or consumer")
    stats.add_argument("channel")
    stats.add_argument("consumer", nargs="?")
    return parser


def settings_for(args) -> Settings:
    flags = {name: getattr(args, name, None) for name in
             ("url", "channel_token", "producer_id", "producer_token", "consumer_token", "admin_token")}
    return settings_load(flags=flags, profile=getattr(args, "profile", None), config=getattr(args, "config", None))


def retry_for(args) -> RetryPolicy:
    return RetryPolicy(attempts=max(0, getattr(args, "retries", 5)))


def data_read(spec: str) -> tuple[bytes, str]:
    """``--data``: @FILE and - are bytes (octet-stream unless told), anything else is text."""
    if spec == "-":
        return sys.stdin.buffer.read(), "application/octet-stream"
    if spec.startswith("@"):
        with open(spec[1:], "rb") as fh:
            return fh.read(), "application/octet-stream"
    return spec.encode("utf-8"), "text/plain; charset=utf-8"


def publish_run(args, settings: Settings) -> int:
    settings.need("channel_token", "producer_id", "producer_token")
    body, default_type = data_read(args.data)
    headers = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--header needs NAME=VALUE, not {item!r}")
        headers[name.strip()] = value
    with Producer(settings.url, args.channel, settings.channel_token, settings.producer_id, settings.producer_token,
                  hmac_secret=settings.hmac_secret, retry=retry_for(args)) as producer:
        mid = producer.publish(body, message_id=args.message_id, priority=args.priority,
                               content_type=args.content_type or default_type, headers=headers or None,
                               message_type=args.message_type, partition_key=args.partition_key, gate=args.gate,
                               scheduled_for=args.scheduled_for)
    print(mid)
    return 0


def job_line(job: Job) -> dict:
    line = {"id": job.id, "message_id": job.message_id, "attempt": job.attempt, "priority": job.priority,
            "content_type": job.content_type, "headers": job.headers}
    if job.partition_key is not None:
        line.update(partition_key=job.partition_key, gate=job.gate)
    try:
        line["payload"] = job.payload.decode("utf-8")
    except UnicodeDecodeError:
        line["payload_base64"] = base64.b64encode(job.payload).decode()
    return line


def tail_run(args, settings: Settings) -> int:
    settings.need("channel_token", "consumer_token")
    if args.count is not None and args.count < 1:
        raise ConfigError("--count must be at least 1")
    printed = 0
    with PullConsumer(settings.url, args.channel, args.consumer, settings.channel_token, settings.consumer_token,
                      group=args.group, hmac_secret=settings.hmac_secret, retry=retry_for(args)) as consumer:
        while args.count is None or printed < args.count:
            want = args.batch if args.count is None else min(args.batch, args.count - printed)
            jobs = consumer.fetch(batch=want, expires=args.expires if args.wait is None else min(args.expires, args.wait))
            if not jobs and args.wait is not None:
                break
            shown = []
            try:
                for job in jobs:
                    if args.payload_only:
                        sys.stdout.write(job.payload.decode("utf-8", "replace") + "\n")
                    else:
                        sys.stdout.write(json.dumps(job_line(job), ensure_ascii=False) + "\n")
                    sys.stdout.flush()
                    shown.append(job)
            finally:
                if args.ack and shown:
                    consumer.ack_many([(job, DELIVERED) for job in shown])
            printed += len(jobs)
    return 0


def stats_run(args, settings: Settings) -> int:
    headers = {}
    if settings.channel_token:
        headers["X-Broker-Channel-Token"] = settings.channel_token
    if args.consumer and settings.consumer_token:
        headers["X-Broker-Consumer-Token"] = settings.consumer_token
    need = 2 if args.consumer else 1
    if len(headers) < need:
        if not settings.admin_token:
            settings.need("channel_token", *(("consumer_token",) if args.consumer else ()))
        headers = {"X-Broker-Admin-Token": settings.admin_token}
    path = f"/channel/{path_segment(args.channel)}"
    path += f"/consumer/{path_segment(args.consumer)}" if args.consumer else "/messages-status"
    transport = Transport(settings.url, headers, hmac_secret=settings.hmac_secret, retry=retry_for(args))
    try:
        response, _ = transport.call("GET", path)
    finally:
        transport.close()
    body = response.json()
    for name in SECRET_FIELDS:
        body.pop(name, None)
    print(json.dumps(body, indent=2, sort_keys=True))
    return 0


COMMANDS = {"publish": publish_run, "tail": tail_run, "stats": stats_run}


def main(argv=None) -> int:
    args = parser_build().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return COMMANDS[args.command](args, settings_for(args))
    except ConfigError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 2
    except BrokerError as exc:
        print(f"broker: {exc.status} {exc.code}: {exc.detail}", file=sys.stderr)
        return 1
    except requests.RequestException as exc:
        print(f"broker: cannot reach the broker: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
