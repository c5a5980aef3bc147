"""TF Serving's Predict REST JSON mapping, applied in-process to a SavedModel signature.

TF Serving answers `POST /v1/models/<name>:predict` (see its api_rest.md):

    row format       {"instances": ["Das Haus.", "Ein Hund."]}  -> {"predictions": ["...", "..."]}
    columnar format  {"inputs": ["Das Haus.", "Ein Hund."]}     -> {"outputs": ["...", "..."]}
                     {"inputs": {"sentences": [...]}}           -> {"outputs": [...]}

A single named input may be given bare (as above); a single named output is
returned bare (a list, not `{"translations": [...]}`). Bytes that are not
UTF-8 travel as `{"b64": "<base64>"}`. `predict` reproduces this mapping so
tests (and users without docker) can check a payload against the exported
signature; it is not a server.
"""

import base64

import tensorflow as tf


def _decode_value(value):
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise ValueError(f'A JSON object value must be {{"b64": ...}}. Received: {value!r}')
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    return value


def _encode_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    return value


def predict(signature, payload):
    """Runs a REST `predict` payload (dict) through `signature`, returns the JSON response dict."""
    if not isinstance(payload, dict):
        raise ValueError(f"The request body must be a JSON object. Received: {payload!r:.100}")
    input_specs = signature.structured_input_signature[1]  # {name: TensorSpec}
    output_names = sorted(signature.structured_outputs)
    if ("instances" in payload) == ("inputs" in payload):
        raise ValueError(
            f'The request must have exactly one of "instances" or "inputs". Received keys: '
            f"{sorted(payload)}"
        )
    row_format = "instances" in payload
    data = payload["instances" if row_format else "inputs"]
    if row_format:
        if not isinstance(data, list):
            raise ValueError(f'"instances" must be a list. Received: {data!r:.100}')
        if data and all(isinstance(row, dict) and "b64" not in row for row in data):
            inputs = {name: [row[name] for row in data] for name in input_specs}
        else:
            inputs = {name: data for name in input_specs}
    elif isinstance(data, dict) and set(data) == set(input_specs):
        inputs = data
    else:
        if len(input_specs) != 1:
            raise ValueError(f"Name the inputs {sorted(input_specs)}. Received: {data!r:.100}")
        inputs = {next(iter(input_specs)): data}
    tensors = {}
    for name, spec in input_specs.items():
        value = _decode_value(inputs[name])
        tensors[name] = tf.constant(value, dtype=spec.dtype)
    outputs = {k: _encode_value(v.numpy().tolist()) for k, v in signature(**tensors).items()}
    if row_format:
        if len(output_names) == 1:
            return {"predictions": outputs[output_names[0]]}
        rows = len(outputs[output_names[0]])
        return {"predictions": [{k: outputs[k][i] for k in output_names} for i in range(rows)]}
    if len(output_names) == 1:
        return {"outputs": outputs[output_names[0]]}
    return {"outputs": outputs}
