"""gRPC client for the TF Serving deployment (not run in CI: it needs a running server).

Needs `pip install tensorflow-serving-api` (same minor version as TensorFlow,
e.g. tensorflow-serving-api==2.21.* for TensorFlow 2.21; it pulls grpcio):

    docker compose -f export/serving/docker-compose.yml up -d
    python export/serving/client_grpc.py "Das Haus ist klein."
"""

import argparse


def translate(sentences, target="localhost:8500", model="transformer_de_en",
              signature="serving_default", timeout=60.0):  # fmt: skip
    """Calls PredictionService.Predict with a `sentences` string tensor; returns str list."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    request.inputs["sentences"].CopyFrom(tf.make_tensor_proto(list(sentences), dtype=tf.string))
    response = stub.Predict(request, timeout)
    return [t.decode("utf-8") for t in tf.make_ndarray(response.outputs["translations"])]


def main():
    parser = argparse.ArgumentParser(description="Translate with TF Serving over gRPC.")
    parser.add_argument("sentences", nargs="+")
    parser.add_argument("--target", default="localhost:8500")
    parser.add_argument("--model", default="transformer_de_en")
    parser.add_argument("--signature", default="serving_default")
    args = parser.parse_args()
    for source, target in zip(
        args.sentences, translate(args.sentences, args.target, args.model, args.signature),
        strict=True,
    ):  # fmt: skip
        print(f"{source}\n  -> {target}")


if __name__ == "__main__":
    main()
