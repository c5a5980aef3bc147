"""REST client for the TF Serving deployment; tests/test_server.py and
tests/test_start_to_finish.py run it against `keras-transformer-serve`, which answers
the same REST API (TF Serving itself does not run in CI).

    docker compose -f export/serving/docker-compose.yml up -d
    python export/serving/client_rest.py "Das Haus ist klein." "Wo ist der Bahnhof?"

Request and response bodies (TF Serving's Predict REST API):

    POST /v1/models/transformer_de_en:predict
    {"instances": ["Das Haus ist klein."]}              -> {"predictions": ["The house is small."]}
    {"signature_name": "translate_greedy", "instances": [...]}   greedy instead of beam 4
    {"inputs": {"sentences": ["Das Haus ist klein."]}}     -> {"outputs": ["The house is small."]}

Only the standard library is used.
"""

import argparse
import json
import urllib.request


def translate(sentences, host="localhost", port=8501, model="transformer_de_en",
              signature="serving_default", timeout=60):  # fmt: skip
    """POSTs `{"instances": sentences}`; returns the list of translations."""
    body = json.dumps({"signature_name": signature, "instances": list(sentences)}).encode()
    request = urllib.request.Request(
        f"http://{host}:{port}/v1/models/{model}:predict",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = json.load(response)
    if "error" in payload:
        raise RuntimeError(f"TF Serving error: {payload['error']}")
    return payload["predictions"]


def main():
    parser = argparse.ArgumentParser(description="Translate with TF Serving over REST.")
    parser.add_argument("sentences", nargs="+")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--model", default="transformer_de_en")
    parser.add_argument("--signature", default="serving_default",
                        help="serving_default (beam 4) or translate_greedy")  # fmt: skip
    args = parser.parse_args()
    translations = translate(args.sentences, args.host, args.port, args.model, args.signature)
    for source, target in zip(args.sentences, translations, strict=True):
        print(f"{source}\n  -> {target}")


if __name__ == "__main__":
    main()
