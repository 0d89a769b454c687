"""Schemathesis against the controller's OpenAPI document: no input makes the API answer 5xx
(once the controller is ready; before that /readyz answers 503 on purpose)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from kubernetes import client as k8s

from pdscale.controller._api import create_app
from pdscale.controller._runtime import Controller, reader_from_spec
from tests.controller.kube_standin import ApiState, api_standin
from tests.controller.memory_cluster import ManualClock
from tests.controller.test_api import make_spec

_state = ApiState()
_state.add("llm", "deployments", "chat-prefill", 2)
_state.add("llm", "deployments", "chat-decode", 2)
_holder: dict[str, Controller] = {}


def _app() -> object:
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="pdscale-openapi-"))
    spec = make_spec(tmp)
    # The API client is created lazily against the stand-in started in the fixture below.
    config = k8s.Configuration(host="http://127.0.0.1:1")
    config.retries = False
    controller = Controller(spec, k8s.ApiClient(config), reader_from_spec(spec),
                            clock=ManualClock(), leader_election=False)
    _holder["c"] = controller
    return create_app(controller)


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@pytest.fixture(scope="module", autouse=True)
def _kube() -> Iterator[None]:
    with api_standin(_state) as url:
        controller = _holder["c"]
        controller.api.configuration.host = url
        # Warmed up (cold: no Prometheus here) and ticked once, so /readyz answers 200: its 503
        # before that is by design, for Kubernetes' readiness probe.
        controller.warm()
        controller.reconciler.tick()
        yield
    _holder["c"].reconciler.close()


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_server_error(case: schemathesis.Case) -> None:
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, response.text[:300])
