import pytest, sys
from datetime import datetime, timedelta, timezone
from tests.spark.workload import workload_report
pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]
def test_x(spark):
    now = datetime.now(timezone.utc)
    workload_report(now=now)
    from pipeline.report import pipeline_report_build
    pipeline_report_build(spark=spark, since=now - timedelta(days=10), out_dir="/tmp/rep", record_latest=False)
