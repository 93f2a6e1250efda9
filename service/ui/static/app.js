// paraplan dashboard: draws the server-built charts and keeps status badges live. No framework.
"use strict";

// Reference lines (a memory limit, a lower bound) across the whole plot area, from the server's config:
// options.plugins.referenceLines.lines = [{value, label, color}] on the value axis.
const referenceLines = {
  id: "referenceLines",
  afterDatasetsDraw(chart, _args, opts) {
    const lines = (opts && opts.lines) || [];
    if (!lines.length) return;
    const area = chart.chartArea;
    const across = chart.options.indexAxis === "y";
    const scale = across ? chart.scales.x : chart.scales.y;
    const ctx = chart.ctx;
    lines.forEach((l) => {
      const p = scale.getPixelForValue(l.value);
      ctx.save();
      ctx.strokeStyle = l.color;
      ctx.lineWidth = 2;
      ctx.setLineDash([6, 4]);
      ctx.beginPath();
      if (across) { ctx.moveTo(p, area.top); ctx.lineTo(p, area.bottom); }
      else { ctx.moveTo(area.left, p); ctx.lineTo(area.right, p); }
      ctx.stroke();
      ctx.restore();
    });
  },
};

function drawCharts() {
  if (typeof Chart === "undefined") return;
  if (!Chart.registry.plugins.get("referenceLines")) Chart.register(referenceLines);
  document.querySelectorAll("canvas[data-chart]").forEach((canvas) => {
    const cfg = document.getElementById(canvas.id + "-config");
    if (!cfg || Chart.getChart(canvas)) return;
    const config = JSON.parse(cfg.textContent);
    // The page shows an HTML legend with the same labels next to each chart (readable, testable).
    config.options = config.options || {};
    config.options.plugins = Object.assign({ legend: { display: false } }, config.options.plugins || {});
    new Chart(canvas, config);
  });
}

// Poll /ui/status for every badge that is not final; reload when one finishes so its numbers appear.
function pollStatuses() {
  const badges = Array.from(document.querySelectorAll("[data-poll-id]"));
  if (!badges.length) return;
  const ids = [...new Set(badges.map((b) => b.dataset.pollId))];
  let delay = 1000;
  const tick = async () => {
    try {
      const resp = await fetch("/ui/status?ids=" + encodeURIComponent(ids.join(",")), { cache: "no-store" });
      if (resp.ok) {
        const found = await resp.json();
        let finished = false;
        badges.forEach((b) => {
          const s = found[b.dataset.pollId];
          if (!s || s === b.textContent) return;
          b.textContent = s;
          b.className = "status status-" + s;
          if (["succeeded", "failed", "cancelled"].includes(s)) finished = true;
        });
        if (finished) { window.location.reload(); return; }
      }
    } catch (err) { /* the service restarts or the network blips: keep polling */ }
    delay = Math.min(delay * 1.3, 5000);
    setTimeout(tick, delay);
  };
  setTimeout(tick, delay);
}

// The new-plan form shows only the fields of the chosen kind.
function kindFields() {
  const kind = document.getElementById("kind");
  if (!kind) return;
  const apply = () => document.querySelectorAll("[data-kinds]").forEach((el) => {
    el.hidden = !el.dataset.kinds.split(" ").includes(kind.value);
  });
  kind.addEventListener("change", apply);
  apply();
}

document.addEventListener("DOMContentLoaded", () => { drawCharts(); pollStatuses(); kindFields(); });
