"""The published OpenAPI document: it names every route the app serves, and schemathesis
(its CLI, as a user runs it) fuzzes a real server on each backend with some stored
requests, within a time budget: no 500s, every answer as the document says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine
from starlette.routing import Mount, Route

from profiler_server.api import openapi
from profiler_server.api.http import build_app
from profiler_server.metrics.health import ServerHealth
from tests.helpers import stored_requests
from tests.test_api import load

FUZZ_SECONDS = 60
# everything schemathesis checks, but that any value the schema allows is accepted: a
# date-time in the year 9999 fits `format: date-time` yet is out of the API's range
CHECKS = ("--checks", "all", "--exclude-checks", "positive_data_acceptance")


def test_every_route_the_app_serves_is_in_the_openapi_document(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    engine = create_engine(f"sqlite:///{tmp_path / 'p.db'}")
    app = build_app(engine, registry, ServerHealth(registry), lambda: True)
    documented = openapi.document()["paths"]
    served = set()
    for route in app.routes:
        if isinstance(route, Route):
            served.add(route.path)
            assert documented[route.path].keys() == {"get"}
            assert route.methods == {"GET", "HEAD"}
        else:
            assert isinstance(route, Mount)
            [inside] = [p for p in documented if p.startswith(route.path + "/{")]
            served.add(inside)
    assert served == set(documented)


def test_the_served_document_is_the_generated_one(server) -> None:
    assert server.get("/openapi.json").json() == openapi.document()


def test_real_answers_match_the_documented_schemas(server) -> None:
    """Beside the fuzzer: every JSON answer over stored requests, checked in full."""
    load(server)
    document = openapi.document()
    for operation in (o["get"] for o in document["paths"].values()):
        for p in operation["parameters"]:
            Draft202012Validator.check_schema(p["schema"])

    def check(path: str, component: str, **params: str) -> None:
        response = server.get(path, **params)
        assert response.status_code == 200, response.text
        schema = {"$ref": f"#/components/schemas/{component}"} | document
        Draft202012Validator(schema).validate(response.json())

    check("/api/requests", "RequestList")
    check("/api/functions", "Functions")
    check("/api/flamegraph", "Stacks", format="json")
    for summary in stored_requests(server.http):
        check(f"/api/requests/{summary['id']}", "Request")
    bad = server.get("/api/requests", limit="0")
    Draft202012Validator({"$ref": "#/components/schemas/Error"} | document).validate(bad.json())


def test_schemathesis_finds_no_500_and_no_answer_off_the_document(server, tmp_path) -> None:
    load(server)
    assert len(stored_requests(server.http)) == 3
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{server.http}/openapi.json",
            *CHECKS,
            "--max-time",
            str(FUZZ_SECONDS),
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--seed",
            "17",
        ],
        cwd=tmp_path,  # where it keeps its examples database and reports
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS * 5,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr[-5_000:]
