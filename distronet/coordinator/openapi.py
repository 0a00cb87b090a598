"""The OpenAPI 3.1 document, generated from the route table and the protocol's schemas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distronet.protocol.coordinator_api import (
    HDR_NONCE,
    HDR_PEER,
    HDR_SIGNATURE,
    HDR_TIME,
    ApiErrorCode,
)
from distronet.protocol.coordinator_session import HDR_MAC, HDR_SESSION
from distronet.protocol.limits import MAX_PROBE_BYTES

if TYPE_CHECKING:
    from distronet.coordinator.routes import Route

__all__ = ["build_openapi"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": [c.value for c in ApiErrorCode]},
                "message": {"type": "string"},
                "field": {"type": "string"},
            },
        }
    },
}


def build_openapi(routes: list[Route], version: str) -> dict[str, Any]:
    """The document served at ``/api/v1/openapi.json``."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"Error": _ERROR}
    for r in routes:
        op: dict[str, Any] = {"operationId": r.name, "summary": r.summary, "responses": _responses(r)}
        params = [
            {"name": p, "in": "path", "required": True, "schema": _path_schema(p)}
            for p in _path_params(r.path)
        ]
        if r.name == "leaderboard":
            params.append(
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}
            )
        if r.name == "probe_down":
            params.append(
                {
                    "name": "bytes",
                    "in": "query",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PROBE_BYTES},
                }
            )
        if r.name == "probe_up":
            op["requestBody"] = {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "maxLength": MAX_PROBE_BYTES}}
                },
            }
        if r.auth == "signed":
            for h in (HDR_PEER, HDR_TIME, HDR_NONCE):
                params.append({"name": h, "in": "header", "required": True, "schema": {"type": "string"}})
            params.append(
                _hdr(HDR_SIGNATURE, "Ed25519 signature (base64): required unless a session MAC is sent")
            )
            if r.mac:
                params.append(_hdr(HDR_SESSION, "session id from POST /runs/{run_id}/session"))
                params.append(_hdr(HDR_MAC, "HMAC-SHA256 (base64) under the session key"))
                op["security"] = [{"peerSignature": []}, {"peerSession": []}]
            else:
                op["security"] = [{"peerSignature": []}]
        elif r.auth == "operator":
            op["security"] = [{"operatorToken": []}]
        if params:
            op["parameters"] = params
        if r.schema is not None:
            schemas[r.schema.name] = r.schema.json_schema()
            op["requestBody"] = {
                "required": bool(r.schema.fields) and any(f.required for f in r.schema.fields),
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{r.schema.name}"}}
                },
            }
        paths.setdefault(r.full_path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "distro-node coordinator",
            "version": version,
            "description": "Runs, admissions, shard leases and the contribution ledger. Operator writes need "
            "`Authorization: Bearer <token>`; node calls are signed with the node's libp2p key (Ed25519), "
            "or carry an HMAC-SHA256 under a session key agreed by one signed X25519 exchange "
            "(`POST /runs/{run_id}/session`; see docs/protocol.md, Coordinator API authentication).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "operatorToken": {"type": "http", "scheme": "bearer"},
                "peerSignature": {"type": "apiKey", "in": "header", "name": HDR_SIGNATURE},
                "peerSession": {"type": "apiKey", "in": "header", "name": HDR_MAC},
            },
        },
    }


def _hdr(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }


def _path_params(path: str) -> list[str]:
    return [seg[1:-1].split(":")[0] for seg in path.split("/") if seg.startswith("{")]


def _path_schema(name: str) -> dict[str, Any]:
    if name == "unit":
        return {"type": "integer", "minimum": 0}
    return {"type": "string", "maxLength": 128}


def _responses(r: Route) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    out: dict[str, Any] = {
        "200": {"description": "OK"},
        "400": {"description": "invalid request", **err},
        "404": {"description": "no such run / item", **err},
        "429": {"description": "rate limited", **err},
    }
    if r.method == "POST":
        out["413"] = {"description": "body too large", **err}
        out["415"] = {"description": "not application/json", **err}
    if r.auth != "none":
        out["401"] = {"description": "not authenticated", **err}
        out["403"] = {"description": "bad token / bad signature or MAC / not admitted / replayed", **err}
    if r.name in ("renew", "complete", "create_run"):
        out["409"] = {"description": "conflict (lease lost, run exists)", **err}
    if r.name == "create_run":
        out["201"] = {"description": "created"}
    if r.name == "probe_down":
        out["200"] = {
            "description": "exactly `bytes` bytes of noise",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    if r.name == "probe_up":
        out["200"] = {
            "description": "the body's size; the body itself is dropped",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["bytes"],
                        "properties": {
                            "bytes": {"type": "integer", "minimum": 0, "maximum": MAX_PROBE_BYTES}
                        },
                    }
                }
            },
        }
        out.pop("415", None)  # any content type: the bytes are only counted
    if r.name == "tokenizer":
        out["200"] = {
            "description": "the run's tokenizers JSON file, byte for byte; a node "
            "keeps it only when its sha256 is the run's data.tokenizer_sha256",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
        out["404"]["description"] = "no such run, or the run has no tokenizer this coordinator serves"
    return out
