// rtvirt live: draws the server's document each time it changes (Server-Sent Events from api/events), without
// reloading. Every string that comes from runs, guests and targets is written as text (append of a string,
// textContent), never as markup; class names come from fixed lists.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const OUTCOMES = new Set(["meets", "partly", "fails"]);
const STATES = new Set(["complete", "failed", "running"]);
const STATS = [["samples", "samples"], ["min_ns", "min"], ["median_ns", "median"], ["mean_ns", "mean"],
  ["p99_ns", "p99"], ["p999_ns", "p99.9"], ["p9999_ns", "p99.99"], ["max_ns", "max"],
  ["max_jitter_ns", "max jitter"]];

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function us(ns) {
  // the running run's figures (a finished run's statistics come written by the server, as the report writes them)
  if (ns === null || ns === undefined) return "-";
  const [whole, fraction] = (ns / 1000).toFixed(3).split(".");
  return `${whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",")}.${fraction}`;
}

function span(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  if (seconds >= 3600) return `${Math.floor(seconds / 3600)} h ${String(Math.floor(seconds % 3600 / 60)).padStart(2, "0")} min`;
  if (seconds >= 60) return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, "0")} s`;
  return `${seconds} s`;
}

// --- a running run: its numbers so far, its histogram and its timeline ----------------------------------------
function histogramFigure(live) {
  const width = 420, height = 150, left = 34, bottom = 20;
  const figure = svg("svg", {width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "histogram of the samples so far"});
  const bins = (live.histogram || []).filter(bin => bin[2] > 0);
  if (!bins.length) return figure;
  const lo = Math.log10(Math.max(100, bins[0][0])), hi = Math.log10(Math.max(bins[bins.length - 1][1], 1000));
  const top = Math.log10(Math.max(...bins.map(bin => bin[2])) + 1);
  const x = ns => left + (Math.log10(Math.max(ns, 100)) - lo) / Math.max(hi - lo, 1e-9) * (width - left - 8);
  const y = count => height - bottom - Math.log10(count + 1) / top * (height - bottom - 8);
  for (const [from, to, count] of bins) {
    figure.append(svg("rect", {x: x(from), y: y(count), width: Math.max(1, x(to) - x(from) - 0.5),
      height: height - bottom - y(count), fill: "#4c78a8"}));
  }
  for (let decade = Math.ceil(lo); decade <= Math.floor(hi); decade++) {
    figure.append(svg("text", {x: x(10 ** decade), y: height - 6, "text-anchor": "middle"}, us(10 ** decade) + " µs"));
  }
  figure.append(svg("text", {x: 2, y: 10}, "count (log)"));
  return figure;
}

function timelineFigure(live, run) {
  const width = 420, height = 150, left = 44, bottom = 20;
  const figure = svg("svg", {width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "maximum and p99 per window so far"});
  const maxima = live.window_max_ns || [], p99s = live.window_p99_ns || [];
  const span_s = Math.max(run.duration_s || 0, maxima.length * live.window_s, 1e-3);
  const top = Math.max(...maxima, 1);
  const x = seconds => left + seconds / span_s * (width - left - 8);
  const y = ns => height - bottom - ns / top * (height - bottom - 10);
  const line = (values, colour) => {
    const points = values.map((v, i) => v === null ? null : `${x((i + 0.5) * live.window_s)},${y(v)}`).filter(Boolean);
    if (points.length) figure.append(svg("polyline", {points: points.join(" "), fill: "none", stroke: colour,
      "stroke-width": 1.2}));
  };
  for (const [at, action] of run.marks || []) {
    figure.append(svg("line", {x1: x(at), x2: x(at), y1: 8, y2: height - bottom, stroke: "#999",
      "stroke-dasharray": "3,3"}));
    figure.append(svg("text", {x: x(at) + 2, y: 16}, action));
  }
  line(maxima, "#c0392b");
  line(p99s, "#2c7fb8");
  figure.append(svg("text", {x: 2, y: y(top) + 4}, us(top)));
  figure.append(svg("text", {x: 2, y: height - bottom}, "0 µs"));
  figure.append(svg("text", {x: left, y: height - 6}, "0 s"));
  figure.append(svg("text", {x: width - 8, y: height - 6, "text-anchor": "end"}, `${span_s.toFixed(1)} s`));
  figure.append(svg("text", {x: left + 4, y: height - bottom - 4, fill: "#c0392b"},
    `max per ${live.window_s} s`));
  figure.append(svg("text", {x: left + 110, y: height - bottom - 4, fill: "#2c7fb8"}, "p99"));
  return figure;
}

function runningPanel(run) {
  const live = run.live;
  const panel = el("div", {class: "running-run", "data-running": run.key});
  panel.append(el("h4", {}, `running: ${run.key}`));
  if (!live || !live.samples) {
    panel.append(el("p", {class: "muted"}, live && live.error ? `stream: ${live.error}` :
      "starting: no sample yet", " ", el("span", {"data-live": "samples"}, "0"), " samples"));
    return panel;
  }
  panel.append(el("p", {},
    el("b", {"data-live": "samples"}, String(live.samples)), " samples · ",
    `${span(live.elapsed_s)} of ${span(run.duration_s)} · max `, el("b", {"data-live": "max"}, us(live.max_ns)),
    ` µs · p99 ≤ ${us(live.p99_ns)} µs · mean ${us(live.mean_ns)} µs · `,
    `${live.outliers} above ${us(live.threshold_ns)} µs · ${live.overruns} overruns`));
  panel.append(el("div", {class: "figures"}, histogramFigure(live), timelineFigure(live, run)));
  return panel;
}

// --- finished runs: the report's statistics, verdicts and what explained their outliers -------------------------
function explanation(explain) {
  if (!explain) return "-";
  if (explain.error) return `not explained: ${explain.error}`;
  const causes = (explain.top_causes || []).map(c =>
    `${c.layer}: ${c.cause} (${((c.share || 0) * 100).toFixed(0)} %)`).join("; ");
  return `${explain.explained} of ${explain.outliers} outliers above ${us(explain.threshold_ns)} µs explained` +
    (causes ? `; ${causes}` : "");
}

function verdictCell(verdicts) {
  // the strictest requirement class the run meets (the report's rule), every class's outcome on hover
  const met = verdicts.filter(([, outcome]) => outcome === "meets").map(([name]) => name);
  const partly = verdicts.filter(([, outcome]) => outcome === "partly").map(([name]) => name);
  const cell = el("td", {"data-stat": "verdict", title: verdicts.map(([name, outcome]) => `${name}: ${outcome}`).join("\n")},
    !verdicts.length ? "-" : met.length ? `meets ${met[0]}` : partly.length ? `partly ${partly[0]}` : "meets no class");
  const outcome = !verdicts.length ? null : met.length ? "meets" : partly.length ? "partly" : "fails";
  if (OUTCOMES.has(outcome)) cell.className = outcome;
  return cell;
}

function runsTable(campaign) {
  const finished = campaign.runs.filter(run => run.result || !["planned", "running"].includes(run.status));
  if (!finished.length) return null;
  const head = el("tr", {}, el("th", {}, "run"), el("th", {}, "status"), el("th", {}, "unit"),
    ...STATS.map(([, label]) => el("th", {}, label)),
    el("th", {}, "verdict"), el("th", {}, "outliers explained"));
  const rows = finished.map(run => {
    const result = run.result || {};
    const shown = result.shown || {};  // the server writes the statistics as the report does
    const status = result.status && result.status !== run.status ? `${run.status} (${result.status})` : run.status;
    return el("tr", {"data-run-key": run.key, "data-run-id": run.run_id || ""},
      el("td", {}, run.key), el("td", {title: run.reason || result.reason || ""}, status),
      el("td", {"data-stat": "unit", title: result.quantity || ""}, result.unit || "-"),
      ...STATS.map(([name]) => el("td", {"data-stat": name}, shown[name] || "-")),
      verdictCell(result.verdicts || []),
      el("td", {class: "text"}, explanation(result.explain)));
  });
  return el("div", {class: "scroll"}, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
}

// --- a campaign: its progress, its running run, its finished runs ----------------------------------------------
function progressBar(campaign) {
  const bar = el("div", {class: "bar", role: "img", "aria-label": "runs done, running and left"});
  const total = Math.max(campaign.runs_total, 1);
  const counts = {complete: campaign.runs_done - campaign.runs_failed, failed: campaign.runs_failed,
    running: campaign.running ? 1 : 0};
  for (const state of STATES) {
    if (counts[state] <= 0) continue;
    const part = el("span", {class: state});
    part.style.width = `${100 * counts[state] / total}%`;  // CSSOM: the policy allows no style attribute
    bar.append(part);
  }
  return bar;
}

function campaignCard(campaign) {
  const card = el("section", {class: "campaign", "data-campaign": campaign.campaign_id});
  card.append(el("h3", {}, campaign.scenario, " ", el("span", {class: "muted"}, campaign.campaign_id)));
  const state = campaign.finished ? "finished" :
    `about ${span(campaign.seconds_left)} of measuring left` +
    (campaign.idle_s > 120 ? ` · no news for ${span(campaign.idle_s)}` : "");
  card.append(progressBar(campaign));
  card.append(el("p", {"data-live": "progress"},
    `${campaign.runs_done} of ${campaign.runs_total} runs done (${campaign.runs_failed} failed), ` +
    `${campaign.running ? 1 : 0} running, ${campaign.runs_left} left · ${state}`));
  const running = campaign.runs.find(run => run.key === campaign.running);
  if (running) card.append(runningPanel(running));
  const table = reused(`table ${campaign.campaign_id}`, campaign.runs.filter(run => run.key !== campaign.running),
    () => runsTable(campaign));
  if (table) card.append(el("h4", {}, "finished runs"), table);
  return card;
}

// Parts whose data did not change keep their nodes: a page open for hours redraws only what moved (the running
// run, once a second), not every campaign's tables.
let built = new Map(), building = new Map();
function reused(name, data, make) {
  const key = JSON.stringify(data);
  const known = built.get(name);
  const entry = known && known.key === key ? known : {key, node: make()};
  building.set(name, entry);
  return entry.node;
}

function render(doc) {
  const campaigns = doc.machines.reduce((n, machine) => n + machine.campaigns.length, 0);
  const when = doc.generated ? new Date(doc.generated).toLocaleTimeString() : "-";
  document.getElementById("status").textContent =
    `${doc.source} · ${campaigns} campaign(s) on ${doc.machines.length} machine(s) · last change ${when}`;
  document.getElementById("errors").replaceChildren(...(doc.errors || []).map(text => el("li", {}, text)));
  document.getElementById("machines").replaceChildren(...doc.machines.map(machine =>
    el("div", {class: "machine", "data-machine": machine.machine}, el("h2", {}, machine.machine),
      ...(machine.campaigns.length ? machine.campaigns.map(c => reused(`campaign ${c.campaign_id}`, c,
        () => campaignCard(c))) : [el("p", {class: "muted"}, "no campaign")]))));
  [built, building] = [building, new Map()];  // what this document did not show is forgotten
  if (!doc.machines.length) {
    document.getElementById("machines").append(el("p", {class: "muted"}, "No campaign yet: this page shows one as soon as it starts."));
  }
}

// --- history of one configuration --------------------------------------------------------------------------------
async function showTrend(event) {
  event.preventDefault();
  const config = document.getElementById("trend-config").value;
  const metric = document.getElementById("trend-metric").value;
  const target = document.getElementById("trend");
  if (!config) return;
  const answer = await fetch(`api/trend?config=${encodeURIComponent(config)}&metric=${encodeURIComponent(metric)}`);
  if (!answer.ok) { target.replaceChildren(el("p", {class: "warn"}, `${answer.status} ${answer.statusText}`)); return; }
  const trend = await answer.json();
  const parts = [];
  for (const [machine, points] of Object.entries(trend.machines)) {
    const rows = points.map(p => el("tr", {"data-run-id": p.run_id}, el("td", {}, p.created.slice(0, 19)),
      el("td", {}, p.run_id),
      el("td", {}, typeof p.value === "number" ? (trend.unit === "ns" ? us(p.value) : String(p.value)) : (p.value || "-")),
      el("td", {}, p.status || "-"),
      el("td", {class: "text"}, Object.entries(p.changes).map(([k, [a, b]]) => `${k}: ${a} → ${b}`).join("; "))));
    parts.push(el("h3", {}, `${trend.configuration} on ${machine}`),
      el("div", {class: "scroll"}, el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "created"),
        el("th", {}, "run"), el("th", {}, metric === "class" ? "class" :
          `${metric.replace("_ns", "")} (${trend.unit === "ns" ? "µs" : trend.unit})`),
        el("th", {}, "status"), el("th", {}, "changed"))), el("tbody", {}, ...rows))));
  }
  target.replaceChildren(...(parts.length ? parts : [el("p", {class: "muted"}, "no run of this configuration")]));
}

async function loadConfigurations() {
  const answer = await fetch("api/configurations");
  if (!answer.ok) return;
  const list = (await answer.json()).configurations;
  document.getElementById("trend-configurations").replaceChildren(...list.map(([name, runs]) =>
    el("option", {value: name, label: `${name} (${runs} runs)`})));
}

document.getElementById("trend-form").addEventListener("submit", showTrend);
document.getElementById("trend-config").addEventListener("focus", loadConfigurations, {once: true});
const events = new EventSource("api/events");
events.onmessage = message => render(JSON.parse(message.data));
events.onerror = () => { document.getElementById("status").textContent = "Connection lost: trying again…"; };
