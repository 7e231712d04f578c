"""A FastAPI service answering look-ups from the live snapshot with
``AsyncShardedReader``.

Run it with ``SHARDYFUSION_ROOT=s3://bucket/snapshots/users uvicorn
fastapi_service:app``. The reader opens once, in the app's lifespan (off the event
loop), and closes on shutdown; every look-up runs on the reader's own bounded thread
pool, so a cold shard downloading never stalls other requests. Values are shown as JSON:
a dict for ``value_format="json"``, text (or hex) for binary values.

The reader follows ``_CURRENT`` every 5 s, so an answer names the run it
was read from: each route reads the values and their run together
(``multi_get_with_run_id``), never ``run_id`` after the read, which a refresh
in between would make name the next run. ``/readyz`` is a readiness probe:
503 without a snapshot or once the reader has not confirmed it is current for
``SHARDYFUSION_MAX_STALENESS_S`` (300 s by default), as ``shardyfusion serve``
answers.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from airflow_provider_shardyfusion import AsyncShardedReader
from airflow_provider_shardyfusion.core.errors import ShardNotServedError
from airflow_provider_shardyfusion.core.model.encoding import key_from_text
from airflow_provider_shardyfusion.serve.readiness import unready_reason

MAX_STALENESS_S = float(os.environ.get("SHARDYFUSION_MAX_STALENESS_S", "300"))


@asynccontextmanager
async def lifespan(app: FastAPI):
    shard_ids = os.environ.get(
        "SHARDYFUSION_SHARD_IDS"
    )  # e.g. "0-15": this host's part of a fleet
    first, _, last = (shard_ids or "").partition("-")
    async with await AsyncShardedReader.open(
        os.environ["SHARDYFUSION_ROOT"],
        cache_dir=os.environ.get(
            "SHARDYFUSION_CACHE_DIR"
        ),  # shared by every worker process of the host
        shard_ids=range(int(first), int(last or first) + 1) if shard_ids else None,
        follow_interval_s=5,
        max_staleness_s=MAX_STALENESS_S,
    ) as reader:
        app.state.reader = reader
        yield


app = FastAPI(lifespan=lifespan)


def _show(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"hex": value.hex()}
    return value


@app.get("/keys/{key}")
async def get_key(key: str, request: Request) -> dict[str, Any]:
    reader: AsyncShardedReader = request.app.state.reader
    typed = key_from_text(key, reader.manifest.key_encoding)
    try:
        # The value and the run it was read from, in one step.
        run_id, (value,) = await reader.multi_get_with_run_id([typed])
    except ShardNotServedError as exc:  # the client routed to the wrong host
        raise HTTPException(status_code=421, detail=str(exc)) from None
    body = {
        "run_id": run_id,
        "key": key,
        "found": value is not None,
        "value": _show(value),
    }
    if value is None:
        raise HTTPException(status_code=404, detail=body)
    return body


class Keys(BaseModel):
    keys: list[str]


@app.post("/multi_get")
async def multi_get(request: Request, body: Keys) -> dict[str, Any]:
    reader: AsyncShardedReader = request.app.state.reader
    typed = [key_from_text(key, reader.manifest.key_encoding) for key in body.keys]
    run_id, values = await reader.multi_get_with_run_id(typed)
    return {"run_id": run_id, "values": [_show(v) for v in values]}


@app.post("/refresh")
async def refresh(request: Request) -> dict[str, Any]:
    reader: AsyncShardedReader = request.app.state.reader
    moved = await reader.refresh()
    return {"run_id": reader.run_id, "refreshed": moved}


@app.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    reader: AsyncShardedReader = request.app.state.reader
    health = await reader.health()
    reason = unready_reason(health, MAX_STALENESS_S)
    body = {
        "ready": reason is None,
        "status": health.status,  # "degraded" while a check fails: still ready
        "run_id": health.run_id,
        "last_error": health.last_error,
        "reason": reason,
    }
    return JSONResponse(body, status_code=200 if reason is None else 503)
