"""`vitkit serve`: a classifier behind HTTP. The model is loaded once (`service.Service`),
concurrent requests are batched (`batcher.Batcher`, `batcher.Batching`), uploads are read
with limits (`uploads`, `limits.Limits`), and the Starlette app (`app.create_app`) runs on
uvicorn (`server`). The web stack is the `serve` extra (starlette, uvicorn, python-multipart),
so this package imports nothing until one of its modules is asked for."""
