"""DATABASE_URL read as libpq reads its URIs (multi-host, any libpq parameter), refused with one
line naming the part when unusable, and written back out as a URL and as the JDBC URL, without a
database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.db.urls import (LIBPQ_DEFAULTS, DatabaseUrlError, database_url_parse, database_url_render,
                            django_database, hosts_of, jdbc_url, options_settings)


def test_the_multi_host_form_every_ha_postgresql_is_reached_by():
    db = django_database("postgres://u:p@h1:5432,h2:5433/broker?target_session_attrs=read-write"
                         "&sslmode=require&connect_timeout=3&keepalives_idle=7")
    assert (db["HOST"], db["PORT"], db["NAME"], db["USER"], db["PASSWORD"]) == ("h1,h2", "5432,5433", "broker",
                                                                               "u", "p")
    assert db["ENGINE"] == "broker.db.backend"
    assert db["OPTIONS"]["target_session_attrs"] == "read-write"
    assert db["OPTIONS"]["sslmode"] == "require"
    # given values win over the defaults; the defaults fill the rest
    assert db["OPTIONS"]["connect_timeout"] == "3" and db["OPTIONS"]["keepalives_idle"] == "7"
    assert db["OPTIONS"]["keepalives_count"] == LIBPQ_DEFAULTS["keepalives_count"]
    assert db["OPTIONS"]["tcp_user_timeout"] == LIBPQ_DEFAULTS["tcp_user_timeout"]


def test_a_single_host_url_reads_as_before():
    db = django_database("postgresql://postgres@127.0.0.1:5999/broker")
    assert (db["HOST"], db["PORT"], db["NAME"], db["USER"], db["PASSWORD"]) == ("127.0.0.1", "5999", "broker",
                                                                               "postgres", "")
    assert set(db["OPTIONS"]) == set(LIBPQ_DEFAULTS)


def test_hosts_without_a_port_get_the_default_one_each():
    db = django_database("postgres://h1,h2:6000,[::1]/db")
    assert db["HOST"] == "h1,h2,::1" and db["PORT"] == "5432,6000,5432"
    assert django_database("postgres://h1,h2/db")["PORT"] == ""  # libpq's default for all


def test_percent_encoded_parts_are_decoded():
    db = django_database("postgres://us%40er:p%3Ass%2Fw%23rd@%2Fvar%2Frun%2Fpostgresql/my%20db")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["NAME"]) == ("us@er", "p:ss/w#rd", "/var/run/postgresql",
                                                                  "my db")


def test_query_host_and_port_are_libpqs_other_spelling():
    db = django_database("postgresql:///broker?host=/tmp&port=5433")
    assert (db["HOST"], db["PORT"]) == ("/tmp", "5433")
    db = django_database("postgresql://u@/broker?host=a,b&port=1,2")
    assert (db["HOST"], db["PORT"]) == ("a,b", "1,2")
    assert "host" not in db["OPTIONS"] and "port" not in db["OPTIONS"]


def test_the_options_parameter_is_kept():
    db = django_database("postgres://h/db?options=-c%20statement_timeout%3D5000")
    assert db["OPTIONS"]["options"] == "-c statement_timeout=5000"
    assert options_settings("-c statement_timeout=5000 -c jit=off --lock-timeout=1s -cwork_mem=4MB") == {
        "statement_timeout", "jit", "lock_timeout", "work_mem"}


@pytest.mark.parametrize("url, part", [
    ("mysql://u@h/db", "scheme 'mysql'"),
    ("h1:5432/db", "is not a URL"),
    ("postgres://u@h1:5432,h2:x/db", "port 'x' of host 'h2'"),
    ("postgres://u@h1:70000/db", "port '70000' of host 'h1'"),
    ("postgres://u@h1,,h2/db", "host 2 of 3"),
    ("postgres://u@h1:5432", "names no database"),
    ("postgres://u@h1/db?conn_max_age=60", "query parameter 'conn_max_age' is not a libpq connection parameter"),
    ("postgres://u@h1/db?sslmode=sometimes", "sslmode='sometimes' is not one of disable, allow"),
    ("postgres://u@h1/db?target_session_attrs=rw", "target_session_attrs='rw' is not one of any, read-write"),
    ("postgres://u@h1/db?connect_timeout=soon", "connect_timeout='soon' is not a whole number"),
    ("postgres://u@h1/db?keepalives_idle=-3", "keepalives_idle='-3'"),
    ("postgres://u@h1/db?sslmode=require&sslmode=disable", "'sslmode' is given twice"),
    ("postgres://u@h1/db?sslmode", "'sslmode' has no value"),
    ("postgres://u@[::1/db", "opens '['"),
    ("postgres://u@h1,h2/db?port=1,2,3", "names 3 ports for 2 hosts"),
    ("postgres://u:pa#ss@h1/db", "fragment"),
])
def test_a_url_it_cannot_use_is_one_line_naming_the_part(url, part):
    with pytest.raises(DatabaseUrlError) as caught:
        database_url_parse(url)
    message = str(caught.value)
    assert message.startswith("DATABASE_URL: ") and part in message and "\n" not in message


def test_the_password_is_never_in_the_message():
    with pytest.raises(DatabaseUrlError) as caught:
        database_url_parse("postgres://u:s3cret-pw@h1:bad/db")
    assert "s3cret-pw" not in str(caught.value)


def test_the_jdbc_url_names_every_host_and_the_primary():
    db = django_database("postgres://u:p@h1:5432,h2:5433/broker?target_session_attrs=read-write&sslmode=require")
    url = jdbc_url(db, params={"ApplicationName": "broker-pipeline", "options": "-c jit=off"})
    assert url.startswith("jdbc:postgresql://h1:5432,h2:5433/broker?")
    query = dict(pair.split("=", 1) for pair in url.split("?", 1)[1].split("&"))
    assert query["targetServerType"] == "primary" and query["sslmode"] == "require"
    assert query["connectTimeout"] == LIBPQ_DEFAULTS["connect_timeout"] and query["tcpKeepAlive"] == "true"
    assert query["options"] == "-c%20jit%3Doff" and query["ApplicationName"] == "broker-pipeline"
    assert jdbc_url(django_database("postgres://[::1]:5/db"), params={}).startswith("jdbc:postgresql://[::1]:5/db")


def test_jdbc_needs_tcp_hosts():
    with pytest.raises(DatabaseUrlError, match="unix socket"):
        jdbc_url(django_database("postgresql:///broker?host=/tmp"), params={})


def test_a_rendered_url_reads_back_the_same():
    db = django_database("postgres://u%40x:p%2Fw@h1:5432,[::1]:5433/my%20db")
    again = django_database(database_url_render(db))
    assert {k: again[k] for k in ("HOST", "PORT", "NAME", "USER", "PASSWORD")} == {
        k: db[k] for k in ("HOST", "PORT", "NAME", "USER", "PASSWORD")}
    assert hosts_of(db) == [("h1", 5432), ("::1", 5433)]
    assert database_url_render(db, dbname="other", params={"target_session_attrs": "read-write"}).endswith(
        "/other?target_session_attrs=read-write")


_names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@given(user=_names, password=_names, dbname=_names,
       hosts=st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9.-]{0,10}", fullmatch=True),
                                st.integers(1, 65535)), min_size=1, max_size=3))
def test_any_parts_survive_a_round_trip(user, password, dbname, hosts):
    db = {"USER": user, "PASSWORD": password, "NAME": dbname, "HOST": ",".join(h for h, _ in hosts),
          "PORT": ",".join(str(p) for _, p in hosts)}
    again = django_database(database_url_render(db))
    assert (again["USER"], again["PASSWORD"], again["NAME"]) == (user, password, dbname)
    assert hosts_of(again) == hosts
