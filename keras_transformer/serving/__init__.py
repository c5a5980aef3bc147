"""`keras-transformer-serve` and the front end every translator shares, room by room.

    frontend.py  the front-end contract: what every translation path does to its
                 input (blank, over-long, invalid UTF-8, control characters), and
                 the export's folder of versions
    requests.py  a predict request read and checked: TF Serving's formats, this
                 server's fields, their types, ranges and `Limits`
    access.py    who may call: the Host and Origin allow-lists
    app.py       the HTTP application: TF Serving's routes as small handlers
    queue.py     the requests waiting for a worker, batched by their settings
    versions.py  the versions served (TF Serving's policies) and their states; the
                 way back to an earlier one
    served.py    one version served: its queue, its workers, the batches between
    workers.py   the worker processes, one translator each
    engines.py   what a worker runs: ONNX Runtime or CTranslate2, warmed up
    metrics.py   Prometheus metrics and the JSON access log
    page.py      the page at `/`
    cli.py       the command: flags, uvicorn's settings, the drain on SIGTERM

Requests flow cli -> app -> requests -> queue (of a version: served) -> workers ->
engines -> a translator (`keras_transformer.translators`). Importing this
package imports nothing else: neither Keras nor TensorFlow is loaded by the
server or by the ONNX and CTranslate2 translators.
"""
