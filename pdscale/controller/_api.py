"""The controller's HTTP API (FastAPI).

``/healthz`` liveness, ``/readyz`` readiness, ``/metrics`` (OpenTelemetry metrics in
Prometheus format), ``/v1/status``, ``/v1/decisions`` (recent decisions and alert reactions,
with reasons), ``/v1/forecast`` (latest forecast per pool, horizon and quantile), and
``POST /v1/alerts/alertmanager`` (the Alertmanager webhook receiver).
"""

from __future__ import annotations

import json
import queue
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from pdscale.controller._runtime import Controller
from pdscale.controller._webhook import AlertmanagerPayload, NotLeader

__all__ = ["create_app"]

_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class Accepted(BaseModel):
    status: Literal["accepted"]
    alerts: int
    queued: int
    duplicates: int


class Problem(BaseModel):
    error: str
    detail: Any = None


def _problem(code: int, error: str, detail: Any = None,
             headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=code, headers=headers)


async def _read_payload(request: Request, controller: Controller, max_body: int
                        ) -> AlertmanagerPayload | JSONResponse:
    """The webhook's payload, or the problem response that refuses it (disabled, credentials,
    content type, size, JSON, schema)."""
    if controller.webhook_refusal is not None:
        return _problem(403, "webhook disabled", controller.webhook_refusal)
    if not controller.authenticator.check(request.headers.get("authorization")):
        return _problem(401, "missing or wrong credentials",
                        "send the bearer token or basic auth configured in "
                        "spec.reactions.auth", headers={"WWW-Authenticate": "Bearer"})
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return _problem(415, f"expected Content-Type application/json, got {ctype!r}")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_body):
        return _problem(413, f"body over {max_body} bytes",
                        "raise spec.reactions.max_body_bytes or lower max_alerts")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body:
            return _problem(413, f"body over {max_body} bytes",
                            "raise spec.reactions.max_body_bytes or lower max_alerts")
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return _problem(400, "body is not JSON", str(exc))
    except RecursionError:
        return _problem(400, "body is nested too deeply to be an Alertmanager payload")
    try:
        payload = AlertmanagerPayload.model_validate(raw)
    except RecursionError:
        return _problem(400, "body is nested too deeply to be an Alertmanager payload")
    except ValidationError as exc:
        errors = [{"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]}
                  for e in exc.errors(include_url=False)[:20]]
        return _problem(422, "not an Alertmanager webhook payload (version 4)", errors)
    return payload


def _read_routes(app: FastAPI, controller: Controller) -> None:
    """Health, readiness, metrics, status, decisions and forecasts."""
    @app.get("/healthz", summary="Liveness: the loops are running")
    def healthz() -> JSONResponse:
        if controller.alive:
            return JSONResponse({"status": "ok"})
        return _problem(503, "a control loop stopped or is far behind; see /v1/status")

    @app.get("/readyz", summary="Readiness: warmed up and ticked once")
    def readyz() -> JSONResponse:
        ok, why = controller.readiness()
        return JSONResponse({"status": "ready" if ok else "not ready", "detail": why},
                            status_code=200 if ok else 503)

    @app.get("/metrics", summary="OpenTelemetry metrics, Prometheus text format")
    def metrics() -> Response:
        return Response(controller.telemetry.render(), media_type=_PROMETHEUS_TEXT)

    @app.get("/v1/status", summary="Mode, leadership, pools, errors, holds and alerts")
    def status() -> JSONResponse:
        return JSONResponse(controller.status())

    @app.get("/v1/decisions", summary="Recent decisions and alert reactions, newest last")
    def decisions(limit: int = Query(100, ge=1, le=1000),
                  service: str | None = Query(None, max_length=63),
                  pool: Literal["prefill", "decode"] | None = None) -> JSONResponse:
        rows = [d.as_dict() for d in list(controller.reconciler.decisions)]
        rows = [r for r in rows if (service is None or r["service"] == service)
                and (pool is None or r["pool"] == pool)]
        reactions = [r.as_dict() for r in list(controller.receiver.records)]
        return JSONResponse({"decisions": rows[-limit:], "reactions": reactions[-limit:]})

    @app.get("/v1/forecast", summary="Latest forecast per pool: horizons and quantiles")
    def forecast() -> JSONResponse:
        out = {f"{key[0]}/{key[1].value}": record.forecast.as_dict()
               for key, record in list(controller.reconciler.last.items())
               if record.forecast is not None}
        return JSONResponse({"unit": {"prefill": "prompt tokens/s",
                                      "decode": "generated tokens/s"}, "pools": out})


def _webhook_route(app: FastAPI, controller: Controller) -> None:
    """The Alertmanager webhook: checked, parsed, queued for the reaction worker."""
    max_body = controller.spec.reactions.max_body_bytes

    @app.post("/v1/alerts/alertmanager", summary="Alertmanager webhook (payload version 4)",
              status_code=200,
              responses={200: {"model": Accepted}, 400: {"model": Problem},
                         401: {"model": Problem}, 403: {"model": Problem},
                         413: {"model": Problem},
                         415: {"model": Problem}, 422: {"model": Problem},
                         503: {"model": Problem}},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": AlertmanagerPayload.model_json_schema()}}}})
    async def alertmanager(request: Request) -> JSONResponse:
        payload = await _read_payload(request, controller, max_body)
        if isinstance(payload, JSONResponse):
            return payload
        try:
            queued, duplicates = controller.receiver.submit(payload)
        except queue.Full:
            return _problem(503, "reaction queue full; Alertmanager will retry",
                            headers={"Retry-After": "5"})
        except NotLeader:
            return _problem(503, "this replica is the standby; Alertmanager will retry and "
                            "reach the leader", {"identity": controller.identity},
                            headers={"Retry-After": "1"})
        return JSONResponse({"status": "accepted", "alerts": len(payload.alerts),
                             "queued": queued, "duplicates": duplicates})


def create_app(controller: Controller) -> FastAPI:
    app = FastAPI(title="pdscale controller", version="1",
                  description="Forecast-driven prefill/decode autoscaler for disaggregated "
                              "LLM inference: status, decisions, forecasts, metrics and the "
                              "Alertmanager webhook.")
    _read_routes(app, controller)
    _webhook_route(app, controller)
    return app
