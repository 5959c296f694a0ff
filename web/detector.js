// The exported SSD in the browser: the same steps as medaidet.extras.deploy (Python), in plain JS.
//   resize: bilinear, pixel centres aligned, as OpenCV's INTER_LINEAR (what ChainerCV uses)
//   graph:  image (1, 3, S, S) RGB 0-255 -> locs (1, K, 4), scores (1, K, C), default_boxes (K, 4)
//   decode: offsets -> boxes; per class: score >= threshold, the 400 best, NMS at IoU 0.45;
//           the image's 200 best. Boxes are [y_min, x_min, y_max, x_max] in image pixels.
"use strict";

const MEDAIDET = {
  labelNames: ["rbc", "wbc", "platelets"],
  classColors: ["#d62728", "#1f77b4", "#2ca02c"],   // the course's colours (medaidet.data)
  variances: [0.1, 0.2],
  scoreThresh: 0.01, nmsThresh: 0.45, topK: 400, keepTopK: 200,  // the 'evaluate' preset
  countThresh: 0.5,                                               // notebook 05's count
};

// RGBA pixels (H, W) -> float32 (3, size, size), RGB 0-255, bilinear as cv2.INTER_LINEAR.
function resizeToCHW(rgba, height, width, size) {
  const out = new Float32Array(3 * size * size);
  const scaleY = height / size, scaleX = width / size;
  for (let y = 0; y < size; y++) {
    let sy = (y + 0.5) * scaleY - 0.5;
    let y0 = Math.floor(sy), fy = sy - y0;
    if (y0 < 0) { y0 = 0; fy = 0; }
    if (y0 >= height - 1) { y0 = height - 1; fy = 0; }
    const y1 = Math.min(y0 + 1, height - 1);
    for (let x = 0; x < size; x++) {
      let sx = (x + 0.5) * scaleX - 0.5;
      let x0 = Math.floor(sx), fx = sx - x0;
      if (x0 < 0) { x0 = 0; fx = 0; }
      if (x0 >= width - 1) { x0 = width - 1; fx = 0; }
      const x1 = Math.min(x0 + 1, width - 1);
      for (let c = 0; c < 3; c++) {
        const p00 = rgba[(y0 * width + x0) * 4 + c], p01 = rgba[(y0 * width + x1) * 4 + c];
        const p10 = rgba[(y1 * width + x0) * 4 + c], p11 = rgba[(y1 * width + x1) * 4 + c];
        const top = p00 * (1 - fx) + p01 * fx, bottom = p10 * (1 - fx) + p11 * fx;
        out[c * size * size + y * size + x] = top * (1 - fy) + bottom * fy;
      }
    }
  }
  return out;
}

function iou(a, b) {
  const top = Math.max(a[0], b[0]), left = Math.max(a[1], b[1]);
  const bottom = Math.min(a[2], b[2]), right = Math.min(a[3], b[3]);
  if (top >= bottom || left >= right) return 0;
  const overlap = (bottom - top) * (right - left);
  const area = (box) => (box[2] - box[0]) * (box[3] - box[1]);
  return overlap / (area(a) + area(b) - overlap);
}

// indices of the kept candidates, best score first (greedy NMS, at most `limit`)
function nms(boxes, scores, thresh, limit) {
  const order = scores.map((s, i) => i).sort((i, j) => scores[j] - scores[i] || i - j);
  const kept = [];
  for (const i of order) {
    if (kept.every((k) => iou(boxes[i], boxes[k]) < thresh)) kept.push(i);
    if (kept.length >= limit) break;
  }
  return kept;
}

// the `k` best of `scores` (ties: the lower index), in index order
function bestIndexes(scores, k) {
  const best = scores.map((s, i) => i).sort((i, j) => scores[j] - scores[i] || i - j);
  return best.slice(0, k).sort((a, b) => a - b);
}

function decode(locs, scores, priors, nClass, size, height, width, p = MEDAIDET) {
  const k = priors.length / 4, [v0, v1] = p.variances;
  const boxes = [];
  for (let i = 0; i < k; i++) {
    const cy = priors[4 * i], cx = priors[4 * i + 1], h = priors[4 * i + 2], w = priors[4 * i + 3];
    const y = cy + locs[4 * i] * v0 * h, x = cx + locs[4 * i + 1] * v0 * w;
    const bh = h * Math.exp(locs[4 * i + 2] * v1), bw = w * Math.exp(locs[4 * i + 3] * v1);
    boxes.push([y - bh / 2, x - bw / 2, y + bh / 2, x + bw / 2]);
  }
  let found = [];
  for (let label = 0; label < nClass - 1; label++) {
    let idx = [];
    for (let i = 0; i < k; i++) if (scores[i * nClass + label + 1] >= p.scoreThresh) idx.push(i);
    let s = idx.map((i) => scores[i * nClass + label + 1]);
    if (idx.length > p.topK) {
      const keep = bestIndexes(s, p.topK);
      idx = keep.map((j) => idx[j]); s = keep.map((j) => s[j]);
    }
    const keep = nms(idx.map((i) => boxes[i]), s, p.nmsThresh, p.keepTopK);
    for (const j of keep) found.push({ label, score: s[j], box: boxes[idx[j]] });
  }
  if (found.length > p.keepTopK) {
    const keep = bestIndexes(found.map((d) => d.score), p.keepTopK);
    found = keep.map((j) => found[j]);
  }
  const sy = height / size, sx = width / size;
  return found.map((d) => ({ label: d.label, labelName: p.labelNames[d.label], score: d.score,
    box: [d.box[0] * sy, d.box[1] * sx, d.box[2] * sy, d.box[3] * sx] }));
}

async function loadDetector(url) {
  ort.env.wasm.numThreads = 1;   // no cross-origin isolation needed on a plain static server
  ort.env.wasm.wasmPaths = new URL("node_modules/onnxruntime-web/dist/", location.href).href;
  const session = await ort.InferenceSession.create(url, { executionProviders: ["wasm"] });
  const size = 300;
  const probe = await session.run({ image: new ort.Tensor("float32", new Float32Array(3 * size * size),
                                                          [1, 3, size, size]) });
  const priors = probe.default_boxes.data, nClass = probe.scores.dims[2];
  return {
    async detect(rgba, height, width) {
      const x = new ort.Tensor("float32", resizeToCHW(rgba, height, width, size), [1, 3, size, size]);
      const out = await session.run({ image: x });
      return decode(out.locs.data, out.scores.data, priors, nClass, size, height, width);
    },
  };
}
