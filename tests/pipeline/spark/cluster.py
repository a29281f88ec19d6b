"""A standalone Spark cluster on loopback for the tests: one master and one worker (1 core, 1 GB),
started with the pyspark package's own ``bin/spark-class``. Starting returns at once (the JVMs come
up while other tests run); ``ready()`` waits until the worker has registered."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import requests

from tests.processes import Proc, free_port, wait_for


def _spark_class(tmp: Path, name: str, *args: str) -> Proc:
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp),
           "SPARK_DAEMON_MEMORY": "256m", "SPARK_NO_DAEMONIZE": "1"}
    log = tmp / f"{name.rsplit('.', 1)[1].lower()}.log"
    popen = subprocess.Popen([str(home / "bin" / "spark-class"), name, *args], cwd=tmp, env=env,
                             stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(popen, log=log)


class StandaloneCluster:
    def __init__(self, tmp: Path):
        port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.master = _spark_class(tmp, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(self.ui))
        self.worker = _spark_class(tmp, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                                   "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                                   "--work-dir", str(tmp / "work"))

    def _alive(self) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{self.ui}/json/", timeout=2).json().get("aliveworkers", 0) >= 1
        except (requests.RequestException, ValueError):
            return False

    def ready(self, timeout: float = 120) -> str:
        """The master URL once a worker is registered (an assertion error with both logs if not)."""
        assert wait_for(self._alive, timeout=timeout, interval=0.5), (
            f"master:\n{self.master.output()[-3000:]}\nworker:\n{self.worker.output()[-3000:]}")
        return self.url

    def stop(self) -> None:
        self.worker.stop()
        self.master.stop()
