"""``manage.py pipeline report|archive``: the Spark jobs over the broker's database."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from pipeline.archive import ArchiveBusy, ArchiveVerificationError, messages_archive
from pipeline.report import pipeline_report_build
from pipeline.session import spark_session_build
from pipeline.timeparse import duration_parse, moment_parse

ARCHIVE_EPILOG = """\
Crash safety: rows are deleted from PostgreSQL only after the Parquet written for them was read
back and checked (row counts and ids), in batches of --batch-size messages, one transaction each.
If the command dies at any point, run it again with the same --out: it first finishes the
interrupted run (discards unverified output, publishes and prunes verified output) and never
writes a message that is already in the archive, so nothing is lost and nothing is duplicated.
"""


INSTALL_HINT = ("pip install -e '.[spark]', Java 17+ (apt-get install openjdk-17-jre-headless) and the "
                "PostgreSQL JDBC jar (apt-get install libpostgresql-jdbc-java, or set BROKER_JDBC_JAR)")


def spark_requirements_check() -> None:
    """What a run needs, checked before Spark starts: a missing piece is one line saying what to
    install and exit status 2, not a traceback from deep inside pyspark."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise CommandError(f"the pipeline needs PySpark, which is not installed: {INSTALL_HINT}", returncode=2) from None
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK)) and not shutil.which("java"):
        raise CommandError(f"the pipeline needs Java, which was not found (JAVA_HOME, PATH): {INSTALL_HINT}",
                           returncode=2)
    if not os.path.exists(settings.BROKER_JDBC_JAR):
        raise CommandError(f"the pipeline needs the PostgreSQL JDBC driver, not found at {settings.BROKER_JDBC_JAR}: "
                           f"{INSTALL_HINT}", returncode=2)


class Command(BaseCommand):
    help = ("Spark jobs over the broker database (SPARK_MASTER, default local[*]): "
            "'report' (delivery analytics) and 'archive' (archive-and-prune old finished messages).")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="job", required=True, metavar="{report,archive}")
        report = sub.add_parser(
            "report", help="delivery analytics: Parquet + HTML report",
            description="Per channel and consumer: delivered/dead/pending, publish-to-delivery latency "
                        "p50/p95/p99, attempts histogram, top failure reasons, throughput per hour, "
                        "partition completion times, over any window: the days already read come from "
                        "their facts (BROKER_PIPELINE_DIR/facts), the others from the archive and the "
                        "database, and each finished day's facts are written once. Days that lost rows "
                        "to retention are reported incomplete. Writes Parquet aggregates, report.json, "
                        "charts/*.svg and report.html; the admin dashboard links the latest one.")
        report.add_argument("--since", default="7d",
                            help="jobs of messages published since: a duration ago (7d, 24h) or an ISO "
                                 "date/time (default 7d)")
        report.add_argument("--until", default=None, help="end of the window, ISO date/time (default now)")
        report.add_argument("--out", default=None,
                            help="where the report goes (default BROKER_PIPELINE_DIR/reports/<timestamp>); the "
                                 "facts stay in BROKER_PIPELINE_DIR/facts whatever this says")
        report.add_argument("--archive", default=None,
                            help="the archive to read the days retention removed from (default where "
                                 "'pipeline archive' writes: BROKER_PIPELINE_DIR/archive)")
        report.add_argument("--rebuild", action="store_true",
                            help="read every day of the window again and rewrite its facts")
        report.add_argument("--master", default=None, help="Spark master URL (default SPARK_MASTER)")

        archive = sub.add_parser(
            "archive", help="archive old finished messages to Parquet, then delete them",
            description="Messages older than --older-than whose jobs are all DELIVERED (or DEAD for "
                        "longer than --dead-older-than) are written with their jobs, transitions and "
                        "attempts to Parquet under --out (by channel and day), verified, then deleted "
                        "from PostgreSQL. Tokens and secrets are never exported.",
            epilog=ARCHIVE_EPILOG)
        archive.add_argument("--older-than", required=True, help="retention, e.g. 30d")
        archive.add_argument("--dead-older-than", default=None,
                             help=f"retention of dead jobs (default BROKER_DEAD_RETENTION="
                                  f"{settings.BROKER_DEAD_RETENTION})")
        archive.add_argument("--out", default=None, help="archive folder (default BROKER_PIPELINE_DIR/archive)")
        archive.add_argument("--batch-size", type=int, default=1000, help="messages deleted per transaction")
        archive.add_argument("--master", default=None, help="Spark master URL (default SPARK_MASTER)")

    def handle(self, *args, **options):
        spark_requirements_check()
        from pyspark.sql import SparkSession

        try:
            handler = {"report": self._report, "archive": self._archive}[options["job"]]
            handler_args = self._parse(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        owned = SparkSession.getActiveSession() is None
        started = time.monotonic()
        self._say("starting Spark" if owned else "using the running Spark session")
        spark = spark_session_build(master=options.get("master"))
        self._say(f"Spark {spark.version} on {spark.sparkContext.master} ready in {time.monotonic() - started:.1f}s")
        try:
            handler(spark, **handler_args)
        finally:
            if owned:
                spark.stop()

    def _parse(self, options) -> dict:
        if options["job"] == "report":
            since = moment_parse(options["since"])
            until = moment_parse(options["until"]) if options["until"] else None
            out = options["out"] or str(Path(settings.BROKER_PIPELINE_DIR) / "reports" / time.strftime("%Y%m%dT%H%M%S"))
            return {"since": since, "until": until, "out": out, "archive": options["archive"],
                    "rebuild": options["rebuild"]}
        if options["batch_size"] < 1:
            raise ValueError("--batch-size must be at least 1")
        return {
            "older_than": duration_parse(options["older_than"]),
            "dead_older_than": duration_parse(options["dead_older_than"]) if options["dead_older_than"] else None,
            "out": options["out"] or str(Path(settings.BROKER_PIPELINE_DIR) / "archive"),
            "batch_size": options["batch_size"],
        }

    def _say(self, message: str) -> None:
        self.stdout.write(f"[pipeline] {message}")
        self.stdout.flush()

    def _report(self, spark, *, since, until, out, archive, rebuild):
        report = pipeline_report_build(spark=spark, since=since, until=until, out_dir=out, archive_dir=archive,
                                       rebuild=rebuild, progress=self._say)
        rate = report.jobs / report.timings["total"] if report.timings["total"] else 0
        self.stdout.write(self.style.SUCCESS(
            f"report: {report.jobs} jobs in {report.timings['total']:.1f}s ({rate:,.0f} jobs/s; "
            f"{report.figures['jdbc_rows']['total']} rows read over JDBC) -> {report.html_path}"))
        missing = sum(d["missing_jobs"] for d in report.figures["incomplete_days"])
        if missing:
            self.stdout.write(self.style.WARNING(
                f"incomplete: {len(report.figures['incomplete_days'])} day(s) lack {missing} jobs that retention "
                "removed and the archive does not hold (see report.json: incomplete_days)"))

    def _archive(self, spark, *, older_than, dead_older_than, out, batch_size):
        try:
            result = messages_archive(spark=spark, out_dir=out, older_than=older_than,
                                      dead_older_than=dead_older_than, batch_size=batch_size,
                                      progress=self._say)
        except (ArchiveBusy, ArchiveVerificationError) as exc:
            raise CommandError(str(exc)) from exc
        exported = ", ".join(f"{n} {t}" for t, n in result.exported.items()) or "nothing new"
        pruned = result.pruned
        self.stdout.write(self.style.SUCCESS(
            f"archive: exported {exported}; deleted {pruned.get('messages', 0)} messages, "
            f"{pruned.get('jobs', 0)} jobs, {pruned.get('transitions', 0)} transitions, "
            f"{pruned.get('attempts', 0)} attempts in {result.seconds:.1f}s -> {result.out_dir}"))
        if result.changed:
            self.stdout.write(self.style.WARNING(
                f"{len(result.changed)} messages changed since export and were kept in PostgreSQL"))
