"""The analytics notebook runs top to bottom (nbclient, this interpreter's kernel) against the
test database, in its own kernel process with its own local Spark."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from django.db import connection

from broker.db.urls import database_url_render
from tests.pipeline.spark.workload import workload_report
from tests.processes import ROOT

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

NOTEBOOK = ROOT / "notebooks" / "delivery_analytics.ipynb"


def test_notebook_runs_top_to_bottom(spark, monkeypatch, pipeline_dir):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    workload_report(now=datetime.now(timezone.utc), messages_per_channel=20)

    monkeypatch.setenv("DATABASE_URL", database_url_render(connection.settings_dict))
    monkeypatch.setenv("SPARK_MASTER", "local[1]")
    monkeypatch.setenv("BROKER_SPARK_DRIVER_MEMORY", "1g")
    monkeypatch.setenv("PIPELINE_SINCE", "10d")
    monkeypatch.setenv("BROKER_PIPELINE_DIR", str(pipeline_dir))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # kernel "python3" is the ipykernel of the interpreter running the tests (jupyter_client
    # substitutes sys.executable for "python").
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    svgs = [o for o in outputs if o.output_type == "display_data" and "image/svg+xml" in o.get("data", {})]
    assert len(svgs) == 5
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "80 jobs in the window, 80 of them still in PostgreSQL" in text
    assert "incomplete days: none" in text and "rows read over JDBC: {'jobs': 80," in text
    assert not (pipeline_dir / "facts" / "v1" / "days").exists()  # the notebook writes no facts
    assert f"database: {connection.settings_dict['NAME']}" in text
