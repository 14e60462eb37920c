// A small force-directed layout (Fruchterman–Reingold): nodes repel, links pull, a weak
// gravity keeps components on screen. Deterministic (a spiral start, no randomness), so the
// same graph is drawn the same way twice; O(n²) per step, fine for the few hundred nodes
// the graph view asks for.

export function forceLayout(count, links, { width = 1000, height = 700, iterations = 300 } = {}) {
  const cx = width / 2;
  const cy = height / 2;
  const k = Math.sqrt((width * height) / Math.max(1, count)) * 0.6;
  const golden = Math.PI * (3 - Math.sqrt(5));
  const pos = Array.from({ length: count }, (_, i) => {
    const r = 10 * Math.sqrt(i + 1) * (k / 20);
    return { x: cx + r * Math.cos(i * golden), y: cy + r * Math.sin(i * golden) };
  });
  let temperature = width / 8;
  const cooling = temperature / (iterations + 1);
  for (let step = 0; step < iterations; step += 1) {
    const disp = pos.map(() => ({ x: 0, y: 0 }));
    for (let i = 0; i < count; i += 1) {
      for (let j = i + 1; j < count; j += 1) {
        let dx = pos[i].x - pos[j].x;
        let dy = pos[i].y - pos[j].y;
        let d = Math.hypot(dx, dy);
        if (d < 0.01) { dx = 0.01 * (i - j); dy = 0.01; d = Math.hypot(dx, dy); }
        const force = (k * k) / d;
        disp[i].x += (dx / d) * force; disp[i].y += (dy / d) * force;
        disp[j].x -= (dx / d) * force; disp[j].y -= (dy / d) * force;
      }
    }
    for (const [a, b] of links) {
      const dx = pos[a].x - pos[b].x;
      const dy = pos[a].y - pos[b].y;
      const d = Math.max(0.01, Math.hypot(dx, dy));
      const force = (d * d) / k;
      disp[a].x -= (dx / d) * force; disp[a].y -= (dy / d) * force;
      disp[b].x += (dx / d) * force; disp[b].y += (dy / d) * force;
    }
    for (let i = 0; i < count; i += 1) {
      disp[i].x += (cx - pos[i].x) * 0.05 * k / 10;
      disp[i].y += (cy - pos[i].y) * 0.05 * k / 10;
      const d = Math.max(0.01, Math.hypot(disp[i].x, disp[i].y));
      const move = Math.min(d, temperature);
      pos[i].x += (disp[i].x / d) * move;
      pos[i].y += (disp[i].y / d) * move;
    }
    temperature = Math.max(1, temperature - cooling);
  }
  return pos;
}

/** The box around the points as an SVG viewBox: padded (labels run to the right of their
 * node) and never smaller than minW x minH, so a small graph is not blown up. */
export function fitBox(points, { pad = 40, labelRoom = 200, minW = 700, minH = 460 } = {}) {
  if (!points.length) return [0, 0, minW, minH];
  const xs = points.map((p) => p.x);
  const ys = points.map((p) => p.y);
  let x = Math.min(...xs) - pad;
  let y = Math.min(...ys) - pad;
  let w = Math.max(...xs) + labelRoom - x;
  let hh = Math.max(...ys) + pad - y;
  if (w < minW) { x -= (minW - w) / 2; w = minW; }
  if (hh < minH) { y -= (minH - hh) / 2; hh = minH; }
  return [x, y, w, hh];
}
