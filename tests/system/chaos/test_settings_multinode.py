"""The multi-node switches of docs/multi-node.md: django-q2 on Redis when BROKER_Q_REDIS_URL is
set (the ORM queue otherwise), and the Spark master from SPARK_MASTER."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.processes import ROOT

SCRIPT = ("import json, django; django.setup(); from django.conf import settings as s; "
          "print(json.dumps({'q': s.Q_CLUSTER, 'spark': s.SPARK_MASTER}))")


def _settings(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_Q_", "SPARK_MASTER"))}
    base.update({"DJANGO_SETTINGS_MODULE": "broker.settings", "DJANGO_DEBUG": "1", "BROKER_TESTING": "0",
                 "DATABASE_URL": "postgres://u@127.0.0.1:1/unused"}, **env)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=base, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_orm_queue_by_default_and_redis_when_configured():
    default = _settings()
    assert default["q"]["orm"] == "default" and "redis" not in default["q"]
    assert default["spark"] == "local[*]"
    multi = _settings(BROKER_Q_REDIS_URL="redis://10.0.0.5:6379/0", SPARK_MASTER="spark://10.0.0.9:7077",
                      BROKER_Q_CLUSTER_NAME="node-2")
    assert "orm" not in multi["q"] and multi["q"]["redis"] == "redis://10.0.0.5:6379/0"
    assert multi["q"]["name"] == "node-2"
    assert multi["spark"] == "spark://10.0.0.9:7077"
