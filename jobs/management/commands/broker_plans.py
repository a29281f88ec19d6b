"""``manage.py broker_plans``: EXPLAIN every hot statement on the live database and say which
index each uses and what the planner thinks it costs; exit status 1 when one left its index."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand
from django.db import connection

from broker.db.plans import MODES
from jobs.ops.plans import PLAN_MIN_ROWS, jobs_rows, plan_results_store, plans_check, sample_live


class Command(BaseCommand):
    help = (
        "EXPLAIN every hot statement (the -- hot queries of the registries) as the broker runs it: its "
        "generic plan (prepared statements, plan_cache_mode=force_generic_plan), with the real consumers' "
        "ids (the biggest pull and push backlogs). Prints each one's indexes and estimated cost; exit "
        "status 1 when one leaves the index it was written for (or scans or sorts a big table, or would "
        "be JIT-compiled). --custom checks the custom plans too; --store keeps the results for /metrics."
    )

    def add_arguments(self, parser):
        parser.add_argument("--custom", action="store_true", help="also the custom plan of every statement")
        parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
        parser.add_argument("--store", action="store_true",
                            help="store the results (what /metrics broker_plan_regressions reads)")

    def handle(self, *args, custom=False, json=False, store=False, **options):
        sample = sample_live()
        results = plans_check(sample=sample, modes=MODES if custom else MODES[:1])
        if store:
            plan_results_store(results, analyzed_at=None)
        bad = [r for r in results if not r.ok]
        if json:
            self.stdout.write(_dumps({
                "sample": {"pull": sample.pull, "push": sample.push, "grouped": sample.grouped,
                           "parts": sample.parts, "bell": sample.bell},
                "server_version": connection.pg_version,
                "jobs_rows": jobs_rows(),
                "statements": [{"statement": r.case, "mode": r.mode, "indexes": list(r.indexes), "cost": r.cost,
                                "problems": list(r.problems), "notes": list(r.notes)} for r in results],
                "regressions": len(bad)}))
        else:
            rows = jobs_rows()
            if rows < PLAN_MIN_ROWS:
                self.stdout.write(f"jobs_job has ~{max(rows, 0):,} rows (planner statistics): below {PLAN_MIN_ROWS:,} "
                                  "small tables are rightly read whole, so only a missing index counts\n")
            width = max(len(r.case) for r in results) + 2
            for r in results:
                verdict = ("ok" if not r.notes else "ok at this size: " + "; ".join(r.notes)) if r.ok \
                    else "LEFT ITS INDEX: " + "; ".join(r.problems)
                mode = "generic" if r.mode == "force_generic_plan" else "custom"
                self.stdout.write(f"{r.case:{width}} {mode:8} {r.cost:14,.1f}  {', '.join(r.indexes) or '-':60}  "
                                  f"{verdict}")
            self.stdout.write(f"{len(results)} plans, {len(bad)} regressions (sample: pull consumer {sample.pull}, "
                              f"push consumer {sample.push})")
        if bad:
            raise SystemExit(1)


def _dumps(data) -> str:
    return json.dumps(data, indent=2)
