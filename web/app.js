// The page: pick or drop an image, detect, draw, count. Nothing is uploaded anywhere.
"use strict";

const statusLine = document.getElementById("status");
const view = document.getElementById("view");
const modelUrl = new URLSearchParams(location.search).get("model") || "model.onnx";
let detector = null;
let latest = 0;       // the number of the last pick: an earlier, slower one shows nothing

function say(text, state) {
  statusLine.textContent = text;
  statusLine.dataset.state = state;
}

function clear() {    // no counts or boxes of an earlier image under a new image's name
  document.getElementById("counts").hidden = true;
  document.querySelector("#counts tbody").innerHTML = "";
  view.hidden = true;
  window.medaidetResult = null;
}

function pick(file) {
  const ticket = ++latest;
  clear();
  show(file, ticket).catch((error) => {
    if (ticket === latest) say(`${file.name}: ${error}`, "error");
  });
}

async function show(file, ticket) {
  say(`detecting in ${file.name}…`, "working");
  const bitmap = await createImageBitmap(file, { colorSpaceConversion: "none" });
  const { width, height } = bitmap;
  const pixels = new OffscreenCanvas(width, height).getContext("2d");
  pixels.drawImage(bitmap, 0, 0);
  const rgba = pixels.getImageData(0, 0, width, height).data;
  const detections = await detector.detect(rgba, height, width);
  if (ticket !== latest) return;   // another image was picked meanwhile
  const counted = detections.filter((d) => d.score >= MEDAIDET.countThresh);

  view.width = width; view.height = height; view.hidden = false;
  const pen = view.getContext("2d");
  pen.drawImage(bitmap, 0, 0);
  pen.lineWidth = Math.max(2, width / 320);
  for (const d of counted) {
    const [y0, x0, y1, x1] = d.box;
    pen.strokeStyle = MEDAIDET.classColors[d.label];
    pen.strokeRect(x0, y0, x1 - x0, y1 - y0);
  }
  const counts = Object.fromEntries(MEDAIDET.labelNames.map((n) => [n, 0]));
  for (const d of counted) counts[d.labelName] += 1;
  const rows = document.querySelector("#counts tbody");
  rows.innerHTML = "";
  MEDAIDET.labelNames.forEach((name, i) => {
    rows.insertAdjacentHTML("beforeend", `<tr><td><span class="swatch" style="background:` +
      `${MEDAIDET.classColors[i]}"></span>${name}</td><td data-class="${name}">${counts[name]}</td></tr>`);
  });
  document.getElementById("counts").hidden = false;
  window.medaidetResult = { image: file.name, counts, detections: counted };
  say(`${file.name}: ${counted.length} cells (score ≥ ${MEDAIDET.countThresh})`, "done");
}

async function main() {
  try {
    detector = await loadDetector(modelUrl);
  } catch (error) {
    say(`could not load the model ${modelUrl}: ${error}`, "error");
    return;
  }
  say("ready: choose an image", "ready");
  const input = document.getElementById("file");
  input.addEventListener("change", () => input.files[0] && pick(input.files[0]));
  const drop = document.getElementById("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault(); drop.classList.remove("over");
    const file = e.dataTransfer.files[0];
    if (file) pick(file);
  });
}

main();
