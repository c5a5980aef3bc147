"""The page `keras-transformer-serve` answers at `/`: type sentences, read their
translations (greedy or beam, the n-best with scores on CTranslate2). It loads
nothing from outside, so it works offline; MODEL_NAME and NBEST_STYLE are filled
in by `app.Handlers.page`."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>keras_transformer: MODEL_NAME</title>
<style>
body { font-family: sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
textarea { width: 100%; height: 6rem; font-size: 1rem; }
#out { white-space: pre-wrap; border: 1px solid #ccc; min-height: 3rem; padding: .5rem; }
.error { color: #a00; }
</style></head>
<body>
<h1>MODEL_NAME</h1>
<p>One sentence per line. Served by keras-transformer-serve (TF Serving's REST API).</p>
<textarea id="src" aria-label="sentences to translate"></textarea>
<p><label>Search <select id="signature">
<option value="serving_default">beam search</option>
<option value="translate_greedy">greedy</option></select></label>
<label style="NBEST_STYLE">N-best <select id="nbest"><option value="">off</option>
<option>2</option><option>4</option></select></label>
<button id="go">Translate</button></p>
<div id="out" aria-live="polite"></div>
<p><small>This export carries no attention weights: no heat map is shown
(keras_transformer.visualize draws them from a trained work directory).</small></p>
<script>
document.getElementById("go").addEventListener("click", async () => {
  const out = document.getElementById("out");
  const lines = document.getElementById("src").value.split("\\n").filter(s => s.trim());
  if (!lines.length) { out.textContent = ""; return; }
  out.className = ""; out.textContent = "...";
  const body = {signature_name: document.getElementById("signature").value, instances: lines};
  const n = document.getElementById("nbest").value;
  if (n && body.signature_name !== "translate_greedy") body.num_hypotheses = Number(n);
  const response = await fetch("/v1/models/MODEL_NAME:predict",
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const payload = await response.json();
  if (payload.error) { out.className = "error"; out.textContent = payload.error; return; }
  out.textContent = payload.predictions.map(p => typeof p === "string" ? p :
    p.translations.map((t, i) => (i + 1) + ". " + t + "  (" + p.scores[i].toFixed(3) + ")")
      .join("\\n")).join(body.num_hypotheses ? "\\n\\n" : "\\n");
});
</script>
</body></html>
"""
