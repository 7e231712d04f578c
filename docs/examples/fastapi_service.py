"""A FastAPI service answering look-ups from the live snapshot with
``AsyncShardedReader``.

Run it with ``SHARDYFUSION_ROOT=s3://bucket/snapshots/users uvicorn
fastapi_service:app``. The reader opens once, in the app's lifespan (off the event
loop), and closes on shutdown; every look-up runs on the reader's own bounded thread
pool, so a cold shard downloading never stalls other requests. Values are shown as JSON:
a dict for ``value_format="json"``, text (or hex) for binary values.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from airflow_provider_shardyfusion import AsyncShardedReader
from airflow_provider_shardyfusion.core.errors import ShardNotServedError
from airflow_provider_shardyfusion.core.model.encoding import key_from_text


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
        value = await reader.get(typed)
    except ShardNotServedError as exc:  # the client routed to the wrong host
        raise HTTPException(status_code=421, detail=str(exc)) from None
    body = {
        "run_id": reader.run_id,
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
    values = await reader.multi_get(typed)
    return {"run_id": reader.run_id, "values": [_show(v) for v in values]}


@app.post("/refresh")
async def refresh(request: Request) -> dict[str, Any]:
    reader: AsyncShardedReader = request.app.state.reader
    moved = await reader.refresh()
    return {"run_id": reader.run_id, "refreshed": moved}
