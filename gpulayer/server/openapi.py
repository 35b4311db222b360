"""The OpenAPI 3.1 document of the server, generated from the same route tables it serves.

Every operation of :data:`gpulayer.api.ROUTES` and every route of the server alone
(:data:`gpulayer.server.app.SERVER_ROUTES`) is listed with its scopes (``x-scopes``), its
path, query and body schemas (constraints included: ``limit`` 1..1000, the SHA-256 pattern
of a bundle digest, ...), the ``Gpulayer-Reads`` header of those that answer task records,
its success answer and every error status it may give. Schemas
come from the pydantic records, so they are JSON Schema 2020-12, which OpenAPI 3.1 uses as
it is.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter

from gpulayer import api
from gpulayer.readers import READS, READS_HEADER
from gpulayer.records import JobRecord

REF = "#/components/schemas/{model}"

ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                       "details": {"type": "object"}},
    }},
}

_DESCRIPTIONS = {
    400: "the body is not a JSON object",
    401: "missing or unusable token",
    403: "the token's scope may not use this route",
    404: "no such job, worker, task, bundle or token (or not yours)",
    405: "method not allowed",
    409: "the state does not allow it (a late or conflicting report)",
    413: "the body is over the server's limit",
    422: "input of the wrong shape, naming the field",
}


def _schema(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    schema = TypeAdapter(tp).json_schema(ref_template=REF, mode="serialization")
    components.update(schema.pop("$defs", {}))
    return schema


def _input_schema(model: type[api.Wire], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=REF, mode="validation")
    components.update(schema.pop("$defs", {}))
    return schema


#: the request header that asks for the fields of task records an older client would refuse
#: (what :func:`gpulayer.wire.without_usage` leaves out of the answer of a request without it)
READS_PARAMETER = {
    "name": "-".join(word.capitalize() for word in READS_HEADER.split("-")), "in": "header", "required": False,
    "description": f"`{READS}`: the answer's task records hold each ended task's `usage` (what its processes "
                   "used); without it they leave it out, as clients from before it read them",
    "schema": {"type": "string", "examples": [READS]},
}


def _errors(statuses: list[int]) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/Error"}
    return {str(s): {"description": _DESCRIPTIONS[s], "content": {"application/json": {"schema": ref}}}
            for s in sorted(set(statuses))}


def _operation(r: api.Route, components: dict[str, Any]) -> dict[str, Any]:
    params: list[dict[str, Any]] = []
    for name in r.path_params:
        schema: dict[str, Any] = {"type": "string", "minLength": 1}
        if name in r.path_patterns:
            schema["pattern"] = r.path_patterns[name]
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    if r.query is not None:
        qs = _input_schema(r.query, components)
        for name, prop in qs.get("properties", {}).items():
            params.append({"name": name, "in": "query", "required": name in qs.get("required", []),
                           "description": prop.get("description", ""), "schema": prop})
    if r.response in (JobRecord, list[JobRecord]):  # (the answers with task records)
        params.append(dict(READS_PARAMETER))
    responses: dict[str, Any]
    if r.exists:
        responses = {"200": {"description": "stored"}, "404": {"description": "not stored"}}
    elif r.raw_response:
        responses = {str(r.status): {"description": "OK", "content": {
            r.raw_response: {"schema": {"type": "string", "format": "binary"}}}}}
    elif r.response is None:
        responses = {str(r.status): {"description": "done"}}
    else:
        content = {"application/json": {"schema": _schema(r.response, components)}}
        responses = {str(code): {"description": "OK", "content": content} for code in (r.status, *r.also_ok)}
    statuses = [401, 403, 422, *r.errors]
    if r.body is not None:
        statuses += [400, 413]
    responses.update({k: v for k, v in _errors(statuses).items() if k not in responses})
    item: dict[str, Any] = {"operationId": r.op, "summary": r.summary, "x-scopes": list(r.scopes),
                            "security": [{"bearer": []}], "responses": responses}
    if params:
        item["parameters"] = params
    if r.body is not None:
        item["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": _input_schema(r.body, components)}}}
    elif r.raw_body:
        item["requestBody"] = {"required": True, "content": {r.raw_body: {
            "schema": {"type": "string", "format": "binary"}}}}
    return item


@functools.lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    from gpulayer import __version__ as version
    from gpulayer.server.app import SERVER_ROUTES

    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    paths: dict[str, Any] = {}
    for r in api.ROUTES:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, components)
    for sr in SERVER_ROUTES:
        ok: dict[str, Any] = {"description": "OK", "content": {sr.media: {"schema": {"type": "object"} if
                                                                          sr.media == "application/json" else
                                                                          {"type": "string"}}}}
        item: dict[str, Any] = {"operationId": sr.name, "summary": sr.summary, "x-scopes": list(sr.scopes),
                                "responses": {"200": ok}}
        if sr.auth:
            item["security"] = [{"bearer": []}]
            item["responses"].update(_errors([401, 403]))
        else:
            item["security"] = []
        paths.setdefault(sr.path, {})[sr.method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "GPUlayer control plane", "version": version},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
