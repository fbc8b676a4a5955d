"""The OpenAPI 3.1 description of the API, written out (no framework generates it)."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "refused; the body says why",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}}
        }
    },
}
_REFUSALS = {
    "400": _ERROR,  # a bad parameter or a malformed body
    "408": _ERROR,  # the body came too slowly
    "413": _ERROR,  # over the upload, pixel or file-count limit
    "415": _ERROR,  # not multipart, not an image type
    "422": _ERROR,  # not an image, truncated, corrupt, too small
    "503": {**_ERROR, "description": "the queue is full; retry after the Retry-After seconds"},
}
_IMAGES = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "file": {"type": "array", "items": {"type": "string", "format": "binary"}}
                },
            }
        },
        "image/*": {"schema": {"type": "string", "format": "binary"}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
}
_PREDICTION = {
    "type": "object",
    "properties": {
        "class": {"type": "string"},
        "index": {"type": "integer"},
        "probability": {"type": "number"},
    },
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


_PATHS = {
    "/predict": {
        "post": {
            "summary": "the most probable classes of one or several images",
            "parameters": [
                _query(
                    "topk",
                    {"type": "integer", "minimum": 1, "default": 5},
                    "classes per image (at most the model's)",
                )
            ],  # fmt: skip
            "requestBody": _IMAGES,
            "responses": {
                "200": _json(
                    "one result per image, in the order sent",
                    {
                        "type": "object",
                        "properties": {
                            "model": {"type": "string"},
                            "precision": {"type": "string"},
                            "results": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "image": {"type": "string"},
                                        "predictions": {"type": "array", "items": _PREDICTION},
                                    },
                                },
                            },
                        },
                    },
                ),  # fmt: skip
                **_REFUSALS,
            },
        }
    },
    "/explain": {
        "post": {
            "summary": "where the model looks in one image: a heat map over it",
            "parameters": [
                _query(
                    "class",
                    {"type": "string"},
                    "the class to explain, a name or an index (default: the predicted one)",
                ),  # fmt: skip
                _query(
                    "map",
                    {"enum": ["relevance", "rollout", "cls_attention"]},
                    "class relevance (Chefer et al.), attention rollout or the last block's "
                    "class-token attention (default: relevance)",
                ),  # fmt: skip
                _query(
                    "format",
                    {"enum": ["png", "json"]},
                    "an overlay PNG or the map as JSON (default: png)",
                ),  # fmt: skip
            ],
            "requestBody": _IMAGES,
            "responses": {
                "200": {
                    "description": "the overlay (X-Predicted-Class, X-Explained-Class headers) "
                    "or the map",
                    "content": {"image/png": {}, "application/json": {}},
                },
                **_REFUSALS,
            },
        }
    },
    "/health": {"get": {"summary": "ready", "responses": {"200": _json("ready", {})}}},
    "/health/live": {
        "get": {
            "summary": "the process answers (liveness)",
            "responses": {"200": _json("live", {"type": "object"})},
        }
    },
    "/health/ready": {
        "get": {
            "summary": "the model is loaded and warmed up (readiness)",
            "responses": {
                "200": _json("ready", {"type": "object"}),
                "503": _json("warming up", {"type": "object"}),
            },
        }
    },
    "/metrics": {
        "get": {
            "summary": "the server's metrics in Prometheus' text format",
            "responses": {"200": {"description": "metrics", "content": {"text/plain": {}}}},
        }
    },
    "/v2": {
        "get": {
            "summary": "Open Inference Protocol: the server's metadata",
            "responses": {"200": _json("server metadata", {"type": "object"})},
        }
    },
    "/v2/health/live": {
        "get": {
            "summary": "Open Inference Protocol: liveness",
            "responses": {"200": _json("live", {"type": "object"})},
        }
    },
    "/v2/health/ready": {
        "get": {
            "summary": "Open Inference Protocol: readiness (503 before)",
            "responses": {"200": _json("ready", {"type": "object"})},
        }
    },
    "/v2/models/{name}": {
        "get": {
            "summary": "Open Inference Protocol: the model's inputs and outputs",
            "responses": {"200": _json("model metadata", {"type": "object"})},
        }
    },
    "/v2/models/{name}/ready": {
        "get": {
            "summary": "Open Inference Protocol: the model is ready",
            "responses": {"200": _json("ready", {"type": "object"})},
        }
    },
    "/v2/models/{name}/infer": {
        "post": {
            "summary": "Open Inference Protocol: probabilities and top classes of FP32 images "
            "[batch, C, H, W] or BYTES image files [batch] (JSON, or Triton's binary tensors)",
            "requestBody": {"required": True, "content": {"application/json": {}}},
            "responses": {"200": _json("the outputs", {"type": "object"}), **_REFUSALS},
        }
    },
    "/info": {
        "get": {
            "summary": "the model, its classes, data config, precision, batching and the batch "
            "sizes served so far",
            "responses": {"200": _json("the server's model and settings", {"type": "object"})},
        }
    },
    "/": {
        "get": {
            "summary": "a page to try the model",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
        }
    },  # fmt: skip
}


def openapi(version: str) -> dict[str, Any]:
    """The description, for vitkit `version`."""
    info = {
        "title": "vitkit serve",
        "version": version,
        "description": "A Vision Transformer classifier behind HTTP.",
    }
    return {"openapi": "3.1.0", "info": info, "paths": _PATHS}
