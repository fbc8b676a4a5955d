"""The page at `/`: pick or drop an image, see its top-5 classes and the explanation over it.
Plain HTML and a little JavaScript calling /info, /predict and /explain; no build step."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>vitkit serve</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem;
         color: #222; }
  h1 { font-size: 1.4rem; margin-bottom: 0.2rem; }
  #model { color: #666; margin-top: 0; }
  #drop { border: 2px dashed #888; border-radius: 8px; padding: 2rem; text-align: center;
          cursor: pointer; }
  #drop.over { background: #eef5ff; border-color: #36c; }
  #result { display: flex; gap: 2rem; flex-wrap: wrap; margin-top: 1.5rem; }
  table { border-collapse: collapse; min-width: 16rem; }
  td { padding: 0.25rem 0.5rem; border-bottom: 1px solid #ddd; }
  td.score { text-align: right; font-variant-numeric: tabular-nums; }
  td:last-child { width: 8rem; }
  .bar { background: #36c; height: 0.5rem; }
  #error { color: #b00; }
  figure { margin: 0; }
  figure img { max-width: 20rem; image-rendering: auto; }
</style>
</head>
<body>
<h1>vitkit serve</h1>
<p id="model">loading the model's description...</p>
<div id="drop">Drop an image here, or <label><u>pick one</u>
  <input id="file" type="file" accept="image/*" hidden></label></div>
<p id="error" role="alert"></p>
<div id="result">
  <table id="top"><tbody></tbody></table>
  <figure><img id="overlay" alt=""><figcaption id="caption"></figcaption></figure>
</div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);

async function describe() {
  const info = await (await fetch("info")).json();
  $("model").textContent = `${info.model}: ${info.classes.length} classes, ` +
    `${info.data_config.input_size.slice(1).join("x")} input, ${info.precision}, ` +
    `vitkit ${info.version}`;
  $("model").dataset.ready = "true";
}

async function failed(response) {
  try { return (await response.json()).error; } catch (e) { return response.statusText; }
}

async function show(file) {
  $("error").textContent = "";
  $("top").tBodies[0].replaceChildren();
  $("overlay").removeAttribute("src");
  $("caption").textContent = "";
  const form = new FormData();
  form.append("file", file, file.name);
  const predicted = await fetch("predict?topk=5", { method: "POST", body: form });
  if (!predicted.ok) { $("error").textContent = await failed(predicted); return; }
  for (const p of (await predicted.json()).results[0].predictions) {
    const row = $("top").tBodies[0].insertRow();
    row.insertCell().textContent = p.class;
    const score = row.insertCell();
    score.className = "score";
    score.textContent = p.probability.toFixed(4);
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.round(p.probability * 100)}%`;
    row.insertCell().append(bar);
  }
  const explained = await fetch("explain", { method: "POST", body: form });
  if (!explained.ok) { $("error").textContent = await failed(explained); return; }
  $("overlay").src = URL.createObjectURL(await explained.blob());
  const target = explained.headers.get("X-Explained-Class");
  $("overlay").alt = `relevance for ${target}`;
  $("caption").textContent = `where the model looks for ${target}`;
}

$("file").addEventListener("change", () => { if ($("file").files[0]) show($("file").files[0]); });
$("drop").addEventListener("dragover", (e) => {
  e.preventDefault();
  $("drop").classList.add("over");
});
$("drop").addEventListener("dragleave", () => $("drop").classList.remove("over"));
$("drop").addEventListener("drop", (e) => {
  e.preventDefault();
  $("drop").classList.remove("over");
  if (e.dataTransfer.files[0]) show(e.dataTransfer.files[0]);
});
describe().catch((e) => { $("model").textContent = `cannot reach the server: ${e}`; });
</script>
</body>
</html>
"""
