# The soak with abuse mixed in (docs/serving.md, "Running it in production"): the tiny test
# fixture's export (tests/export_fixtures.py: make_work_dir, then export_after_training),
# two workers with one thread, 128 clients of which 13 send the bad requests, a worker
# SIGKILLed every 2 minutes.
${PYTHON:-python} benchmarks/serve_load.py /tmp/kt/saved_models/transformer_de_en/onnx --clients 128 \
    --seconds 600 --workers 2 --threads 1 --kill-worker-every 120 --abuse-share 0.1 \
    --no-direct --out benchmarks/results/serve_abuse_soak_zen3_2026-12-03/soak.json
