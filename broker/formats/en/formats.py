"""Date formats for the admin: ISO-like, to the second, in UTC, so operators can compare them
with logs and database rows (Django's English default is "Nov. 22, 2026, 7:25 p.m.")."""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
TIME_FORMAT = "H:i:s"
