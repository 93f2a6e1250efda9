// paraplan dashboard: draws the server-built charts and keeps status badges live. No framework.
"use strict";

function drawCharts() {
  if (typeof Chart === "undefined") return;
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
