"""`vitkit serve`: a classifier behind HTTP. The model is loaded once per worker
(`service.Service` over a torch `inference.Predictor` or an `inference.OnnxPredictor`),
concurrent requests are batched (`batcher.Batcher`, `batcher.Batching`), uploads are read
with limits (`uploads`, `limits.Limits`), and the Starlette app (`app.create_app`: vitkit's
routes, health probes, Prometheus `metrics`, the Open Inference Protocol's `oip` routes) runs
on uvicorn (`server`), in one process or several (`workers`). The web stack is the `serve`
extra (starlette, uvicorn, python-multipart, prometheus-client), so this package imports
nothing until one of its modules is asked for."""
