// The factstream dashboard: polls /dashboard/state every second and redraws the page from it.
// Plain JavaScript, no build step, nothing loaded from another origin. Every value is put in the page
// with textContent (never as HTML): log messages and names come from the server and are shown as text.
"use strict";

(function () {
  const POLL_MS = 1000;
  const SAMPLES = 60; // rates kept per sparkline (one a poll)
  const params = new URLSearchParams(window.location.search);
  const token = params.get("token");
  const stateUrl = "/dashboard/state" + (token ? "?token=" + encodeURIComponent(token) : "");

  // Client-side history: per stream, the last position seen and the rates computed from it.
  const history = new Map(); // stream -> {position, time, rates: []}
  const longPolls = [];

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function fill(tableId, rows, emptyId) {
    const body = document.querySelector("#" + tableId + " tbody");
    body.replaceChildren(...rows);
    if (emptyId) {
      document.getElementById(emptyId).hidden = rows.length > 0;
      document.getElementById(tableId).hidden = rows.length === 0;
    }
  }

  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 120) return s + "s";
    if (s < 7200) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  }

  function number(n) {
    return n === null || n === undefined ? "–" : Number(n).toLocaleString("en");
  }

  function bytes(n) {
    if (n < 1024) return n + " B";
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let value = n;
    let unit = -1;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return value.toFixed(1) + " " + units[unit];
  }

  function sparkline(values) {
    const width = 120;
    const height = 24;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("class", "sparkline");
    if (values.length > 1) {
      const top = Math.max(...values, 1);
      const step = width / (SAMPLES - 1);
      const offset = width - step * (values.length - 1);
      const points = values.map((v, i) => {
        const x = offset + i * step;
        const y = height - 1 - (v / top) * (height - 2);
        return x.toFixed(1) + "," + y.toFixed(1);
      });
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", points.join(" "));
      svg.append(line);
    }
    return svg;
  }

  function record(samples, value) {
    samples.push(value);
    while (samples.length > SAMPLES) samples.shift();
  }

  function streamRate(name, position, now) {
    let entry = history.get(name);
    if (!entry) {
      entry = { position: position, time: now, rates: [] };
      history.set(name, entry);
      return entry;
    }
    const dt = now - entry.time;
    if (dt > 0) record(entry.rates, Math.max(0, (position - entry.position) / dt));
    entry.position = position;
    entry.time = now;
    return entry;
  }

  function renderInstances(state) {
    const linksByPeer = new Map(state.links.map((link) => [link.peer, link]));
    fill(
      "instances",
      state.instances.map((inst) => {
        const roles = [inst.main ? "main" : "worker"];
        if (inst.self) roles.push("this instance");
        const link = linksByPeer.get(inst.name);
        const linkCell = el("td");
        if (link) linkCell.append(linkBadge(link, state.time));
        else linkCell.append(el("span", { class: "muted", text: inst.self ? "—" : "none from here" }));
        const dashboard = inst.self
          ? el("span", { class: "muted", text: "this page" })
          : inst.dashboard_url
            ? el("a", { href: inst.dashboard_url, text: inst.dashboard_url })
            : el("span", { class: "muted", text: "no HTTP port in instance_map" });
        return el(
          "tr",
          { "data-instance": inst.name, class: inst.self ? "self" : "" },
          el("td", {}, el("strong", { text: inst.name })),
          el("td", { text: roles.join(", ") }),
          linkCell,
          el("td", {}, dashboard),
        );
      }),
    );
  }

  function linkBadge(link, now) {
    const text = link.up ? "up for " + duration(now - link.since) : "down for " + duration(link.down_for);
    return el("span", { class: "badge " + (link.up ? "up" : "down"), text: text });
  }

  function renderLinks(state) {
    const rows = state.links.map((link) => {
      return el(
        "tr",
        { class: "link " + (link.up ? "up" : "down"), "data-peer": link.peer },
        el("td", {}, el("strong", { text: link.peer })),
        el("td", { text: link.transport }),
        el("td", { text: link.direction }),
        el("td", { class: "state" }, linkBadge(link, state.time)),
        el("td", { class: "num", text: number(link.connects) }),
        el("td", { class: "num", text: number(link.disconnects) }),
        el("td", { class: "num", text: number(link.commands_sent) + " / " + number(link.commands_received) }),
        el("td", { class: "num", text: number(link.rows_sent) + " / " + number(link.rows_received) }),
        el("td", { class: "num", text: bytes(link.bytes_sent) + " / " + bytes(link.bytes_received) }),
      );
    });
    fill("links", rows, "links-empty");
  }

  function renderStreams(state) {
    fill(
      "streams",
      state.streams.map((stream) => {
        const entry = streamRate(stream.name, stream.current, state.time);
        const writers = el("td", { class: "writers" });
        const positions = Object.entries(stream.positions);
        if (positions.length === 0) writers.append(el("span", { class: "muted", text: "no writer yet" }));
        for (const [writer, position] of positions) {
          writers.append(
            el("span", { class: "writer", "data-writer": writer }, writer + ": ", el("span", { class: "position", text: number(position) })),
          );
        }
        const latest = entry.rates.length ? entry.rates[entry.rates.length - 1] : 0;
        return el(
          "tr",
          { "data-stream": stream.name },
          el("td", {}, el("strong", { text: stream.name }), stream.is_writer ? el("span", { class: "tag", text: "writer" }) : null),
          writers,
          el("td", { class: "num current", text: number(stream.current) }),
          el("td", { class: "num min", text: number(stream.min) }),
          el("td", { class: "num persisted", text: number(stream.persisted_upto) }),
          el("td", { class: "rate" }, sparkline(entry.rates), el("span", { class: "num", text: latest.toFixed(1) })),
        );
      }),
    );
  }

  function renderLags(state) {
    fill(
      "lags",
      state.lags.map((lag) =>
        el(
          "tr",
          { "data-stream": lag.stream, "data-writer": lag.writer, class: lag.lag_positions > 0 ? "behind" : "" },
          el("td", { text: lag.stream }),
          el("td", { text: lag.writer }),
          el("td", { class: "num", text: number(lag.writer_position) }),
          el("td", { class: "num", text: number(lag.applied_position) }),
          el("td", { class: "num", text: number(lag.lag_positions) }),
          el("td", { class: "num", text: lag.lag_seconds.toFixed(3) }),
        ),
      ),
      "lags-empty",
    );
  }

  function renderCaches(state) {
    fill(
      "caches",
      state.caches.map((cache) => {
        const rate = cache.hit_rate;
        const bar = el("span", { class: "bar" }, el("span", { class: "fill" }));
        bar.firstChild.style.width = rate === null ? "0" : (rate * 100).toFixed(1) + "%";
        return el(
          "tr",
          { "data-cache": cache.name },
          el("td", { text: cache.name }),
          el("td", { class: "num", text: number(cache.size) + " / " + number(cache.max_size) }),
          el("td", { class: "num", text: number(cache.hits) }),
          el("td", { class: "num", text: number(cache.misses) }),
          el("td", { class: "num" }, bar, rate === null ? "–" : (rate * 100).toFixed(1) + "%"),
          el("td", { class: "num", text: number(cache.evictions) }),
          el("td", { class: "num", text: number(cache.invalidations) }),
        );
      }),
      "caches-empty",
    );
  }

  function renderLongPolls(state) {
    record(longPolls, state.long_polls.open);
    document.getElementById("long-polls").textContent = number(state.long_polls.open);
    document.getElementById("long-polls-spark").replaceChildren(sparkline(longPolls));
  }

  function renderProblems(state) {
    fill(
      "problems",
      state.problems.map((p) =>
        el(
          "tr",
          { class: "problem " + p.level.toLowerCase() },
          el("td", { class: "time", text: new Date(p.time * 1000).toISOString().replace("T", " ").slice(0, 19) }),
          el("td", { class: "level", text: p.level }),
          el("td", { text: p.logger }),
          el("td", { class: "message", text: p.message }),
        ),
      ),
      "problems-empty",
    );
  }

  function render(state) {
    document.title = state.instance + " · factstream dashboard";
    document.getElementById("instance").textContent = state.instance;
    document.getElementById("deployment").textContent = state.deployment;
    renderInstances(state);
    renderLinks(state);
    renderStreams(state);
    renderLags(state);
    renderCaches(state);
    renderLongPolls(state);
    renderProblems(state);
  }

  function setStatus(ok, text) {
    const status = document.getElementById("status");
    status.className = "status " + (ok ? "ok" : "failing");
    status.textContent = text;
  }

  async function poll() {
    try {
      const response = await fetch(stateUrl, { cache: "no-store", credentials: "same-origin" });
      if (!response.ok) {
        let message = "HTTP " + response.status;
        try {
          message += ": " + (await response.json()).error;
        } catch (ignored) {
          // not the API's JSON error: the status says enough
        }
        setStatus(false, message);
      } else {
        const state = await response.json();
        render(state);
        setStatus(true, "updated " + new Date(state.time * 1000).toLocaleTimeString("en-GB"));
      }
    } catch (error) {
      setStatus(false, "this instance does not answer (" + error.message + ")");
    }
    window.setTimeout(poll, POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (token) document.getElementById("state-link").href = stateUrl;
    poll();
  });
})();
