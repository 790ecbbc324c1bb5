// Tollgate console. Every figure comes from the operator API of the
// aggregator serving this page; the session cookie authenticates, and
// every change carries the session's CSRF token. Text from the API is
// always set as text (never parsed as HTML).
"use strict";

(function () {
  const session = { role: "", csrf: "" };
  let pollTimer = 0;
  const rateHistory = []; // [time, decisions/s] of the overview's polls

  // ---- helpers -----------------------------------------------------------

  // h builds an element: h("td", {class: "num"}, "12").
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === false || v === null || v === undefined) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const SVG = "http://www.w3.org/2000/svg"; // a namespace name, never fetched
  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function main() { return document.getElementById("main"); }

  function setStatus(text) { document.getElementById("status").textContent = text; }

  // show replaces the page's content and moves focus to its heading, so
  // keyboard and screen-reader users land on the new page.
  function show(title, ...content) {
    const m = main();
    m.replaceChildren(h("h1", { tabindex: "-1", id: "page-title" }, title), ...content);
    document.title = title + " · Tollgate console";
  }

  function message(el, ok, text) {
    el.replaceChildren(h("div", { class: "msg " + (ok ? "ok" : "err"), role: ok ? "status" : "alert" }, text));
  }

  function fmt(n) { return typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: 2 }) : String(n ?? ""); }
  function pct(x) { return (100 * (x || 0)).toFixed(1) + " %"; }

  // ApiError carries the operator API's {"error":{"code","message"}}.
  class ApiError extends Error {
    constructor(status, code, msg) { super(code ? code + ": " + msg : "HTTP " + status + " " + msg); this.status = status; this.code = code; }
  }

  // api calls the operator API with the session cookie; changes carry
  // the CSRF token. It returns {status, headers, body} (body parsed as
  // JSON when it is), or throws ApiError.
  async function api(method, path, body, headers) {
    const init = { method, headers: Object.assign({}, headers || {}), credentials: "same-origin" };
    if (method !== "GET" && method !== "HEAD") {
      init.headers["X-CSRF-Token"] = session.csrf;
      init.headers["X-Tollgate-Actor"] = "console (" + session.role + ")";
    }
    if (body !== undefined) {
      if (typeof body === "string") init.body = body;
      else { init.body = JSON.stringify(body); init.headers["Content-Type"] = "application/json"; }
    }
    const resp = await fetch(path, init);
    const text = await resp.text();
    let parsed = text;
    if ((resp.headers.get("Content-Type") || "").includes("json") && text) {
      try { parsed = JSON.parse(text); } catch (e) { parsed = text; }
    }
    if (resp.status === 401 && !path.startsWith("/console/session")) {
      signedOut("Your session has ended: sign in again.");
      throw new ApiError(401, "UNAUTHORIZED", "signed out");
    }
    if (!resp.ok) {
      const e = parsed && parsed.error ? parsed.error : {};
      throw new ApiError(resp.status, e.code || "", e.message || text);
    }
    return { status: resp.status, headers: resp.headers, body: parsed };
  }

  function keyPath(key) { return encodeURIComponent(key.trim()); }

  // table renders rows (arrays of cells) under a header; a cell may be a
  // Node or text; headers ending in "#" are numeric.
  function table(headers, rows, caption) {
    return h("div", { class: "scroll" }, h("table", {},
      caption ? h("caption", { class: "small" }, caption) : null,
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col", class: t.endsWith("#") ? "num" : null }, t.replace(/#$/, ""))))),
      h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c, i) =>
        h("td", { class: headers[i].endsWith("#") ? "num" : null }, c instanceof Node ? c : fmt(c))))) :
        h("tr", {}, h("td", { colspan: String(headers.length), class: "small" }, "none")))));
  }

  function field(label, input) { return h("label", {}, label, input); }

  // readOnlyNote says what a viewer cannot do.
  function canChange() { return session.role === "admin"; }
  function changeButton(text, attrs) {
    const b = h("button", Object.assign({ type: "button" }, attrs || {}), text);
    if (!canChange()) { b.disabled = true; b.title = "read-only: signed in with the viewer token"; }
    return b;
  }

  // ---- sign-in -----------------------------------------------------------

  async function signIn(body) {
    const resp = await fetch("/console/session", { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const out = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new ApiError(resp.status, out.error ? out.error.code : "", out.error ? out.error.message : "");
    session.role = out.role; session.csrf = out.csrf_token;
  }

  function signedIn() {
    document.getElementById("nav").hidden = false;
    document.getElementById("signout").hidden = false;
    document.getElementById("who").textContent = "signed in: " + session.role + (session.role === "viewer" ? " (read-only)" : "");
    if (!location.hash || location.hash === "#" || location.hash.startsWith("#code=")) history.replaceState(null, "", "#overview");
    route();
  }

  function signedOut(note) {
    session.role = ""; session.csrf = "";
    clearInterval(pollTimer);
    document.getElementById("nav").hidden = true;
    document.getElementById("signout").hidden = true;
    document.getElementById("who").textContent = "";
    const out = h("div", { id: "signin-msg" });
    const input = h("input", { id: "token", type: "password", autocomplete: "current-password", required: true,
      "aria-describedby": "token-help" });
    const form = h("form", { class: "signin", id: "signin-form" },
      h("h1", { tabindex: "-1", id: "page-title" }, "Sign in"),
      h("p", { id: "token-help", class: "small" },
        "Type the admin token (TOLLGATE_ADMIN_TOKEN) or the read-only viewer token (TOLLGATE_VIEWER_TOKEN). ",
        "make run prints both, and a one-time sign-in link."),
      field("Token", input),
      h("div", { class: "buttons" }, h("button", { type: "submit", id: "signin" }, "Sign in")),
      out);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        await signIn({ token: input.value });
        input.value = "";
        signedIn();
      } catch (e) {
        message(out, false, e.status === 401 ? "That is neither the admin nor the viewer token." : e.message);
      }
    });
    main().replaceChildren(form);
    if (note) message(out, false, note);
    document.title = "Sign in · Tollgate console";
    input.focus();
  }

  async function start() {
    document.getElementById("signout").addEventListener("click", async () => {
      try { await api("DELETE", "/console/session"); } catch (e) { /* signed out either way */ }
      signedOut("Signed out.");
    });
    window.addEventListener("hashchange", route);
    const m = /^#code=([A-Za-z0-9_-]+)/.exec(location.hash);
    if (m) {
      history.replaceState(null, "", "#"); // the code is single-use: never keep it in history
      try { await signIn({ code: m[1] }); signedIn(); return; } catch (e) {
        signedOut("The sign-in link was used already or has expired: sign in with a token.");
        return;
      }
    }
    const resp = await fetch("/console/session", { credentials: "same-origin" });
    if (resp.ok) {
      const out = await resp.json();
      session.role = out.role; session.csrf = out.csrf_token;
      signedIn();
    } else {
      signedOut();
    }
  }

  // ---- routing -----------------------------------------------------------

  const pages = { overview, usage, rules, lists, penalties, keys, audit };

  function route() {
    if (!session.role) return;
    clearInterval(pollTimer);
    const [name, query] = location.hash.slice(1).split("?");
    const page = pages[name] ? name : "overview";
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.getAttribute("href") === "#" + page) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const params = new URLSearchParams(query || "");
    Promise.resolve(pages[page](params)).then(() => {
      const t = document.getElementById("page-title");
      if (t) t.focus();
    }).catch((e) => { if (e.status !== 401) show("Error", h("div", { class: "msg err", role: "alert" }, e.message)); });
  }

  function keyLink(k, label) {
    return h("a", { href: "#keys?key=" + encodeURIComponent("kid:" + k.key_id) }, label || k.key_prefix || k.key_id);
  }

  // ---- overview ----------------------------------------------------------

  // tenantName labels a tenant for people: a key configured without a
  // tenant is its own tenant, named by its key_id, which reads as noise,
  // so it is shown as "no tenant (key …)" (own maps those key_ids to the
  // key's prefix).
  function tenantName(tenant, own) {
    return own.has(tenant) ? "no tenant (key " + own.get(tenant) + ")" : tenant;
  }

  // keyTenant names the tenant of one key: a key configured without a
  // tenant is its own tenant, under its key_id, which means nothing to a reader.
  function keyTenant(tenant, keyId, prefix) {
    return tenant && tenant === keyId ? "no tenant (key " + (prefix || keyId) + ")" : (tenant || "—");
  }

  // rateChart draws decisions/s over the polls: a line with its points
  // and the last value written beside it (not colour alone).
  function rateChart(points) {
    const w = 1000, ht = 200, pad = 40;
    const max = Math.max(1, ...points.map((p) => p[1]));
    const x = (i) => pad + (i * (w - 2 * pad)) / Math.max(1, points.length - 1);
    const y = (v) => ht - pad + 10 - (v / max) * (ht - pad - 10);
    const svg = s("svg", { viewBox: `0 0 ${w} ${ht}`, class: "chart", role: "img",
      "aria-label": "decisions per second over the last " + points.length + " polls; latest " + fmt(points.length ? points[points.length - 1][1] : 0) });
    svg.append(s("line", { x1: pad, y1: y(0), x2: w - pad, y2: y(0), stroke: "#8c959f" }));
    svg.append(s("text", { x: 2, y: y(max) + 4 }, fmt(max)), s("text", { x: 2, y: y(0) + 4 }, "0"));
    if (points.length > 1) svg.append(s("polyline", { class: "line", points: points.map((p, i) => x(i) + "," + y(p[1])).join(" ") }));
    points.forEach((p, i) => svg.append(s("circle", { class: "dot", cx: x(i), cy: y(p[1]), r: 2.5 })));
    if (points.length) {
      const last = points[points.length - 1];
      svg.append(s("text", { x: Math.max(pad + 6, Math.min(w - 80, x(points.length - 1) - 60)), y: Math.max(12, y(last[1]) - 6) }, fmt(last[1]) + " /s"));
    }
    return svg;
  }

  async function overview() {
    show("Overview", h("div", { id: "ov" }, h("p", {}, "Loading…")));
    const draw = async () => {
      let o;
      try { o = (await api("GET", "/admin/v1/overview?minutes=5")).body; } catch (e) {
        if (e.status !== 401) setStatus("overview: " + e.message);
        return;
      }
      const box = document.getElementById("ov");
      if (!box) return;
      rateHistory.push([Date.now(), o.traffic.decisions_per_second]);
      while (rateHistory.length > 60) rateHistory.shift();
      const health = o.ready ? "ready" : (o.health.status + (o.health.reason ? " (" + o.health.reason + ")" : ""));
      const ownTenants = new Map(o.top_keys.filter((k) => k.tenant === k.key_id).map((k) => [k.key_id, k.key_prefix || k.key_id]));
      const deps = ["kafka", "nats", "redis"].filter((d) => o.health[d]).map((d) => d + ": " + o.health[d].status).join(", ");
      box.replaceChildren(
        h("div", { class: "cards" },
          card("Decisions / s", fmt(o.traffic.decisions_per_second), "over the last " + o.minutes + " min", "m-rate"),
          card("Rejection rate", pct(o.traffic.rejection_rate), fmt(o.traffic.rejected) + " of " + fmt(o.traffic.allowed + o.traffic.rejected), "m-rejection"),
          card("Decisions", fmt(o.traffic.allowed + o.traffic.rejected), fmt(o.traffic.allowed) + " allowed", "m-decisions"),
          card("Kafka lag", fmt(o.kafka_lag), "events not yet counted", "m-lag"),
          card("Health", health, deps, "m-health"),
          card("Gateways", o.gateways ? fmt(o.gateways.count) : "–", o.gateways ?
            fmt(o.gateways.current) + " on rules v" + o.gateways.rules_version : "NATS not reached", "m-gateways"),
          card("Penalties", "reduced " + o.penalty_levels["1"] + " · cooldown " + o.penalty_levels["2"] + " · blocked " + o.penalty_levels["3"],
            "keys at each level of the penalty ladder", "m-penalties")),
        h("h2", {}, "Decisions per second"),
        rateChart(rateHistory),
        h("div", { class: "grid2" },
          h("section", {}, h("h2", {}, "Keys most rejected"),
            table(["tenant", "key", "rejected#", "allowed#"], o.top_keys.map((k) => [tenantName(k.tenant, ownTenants), keyLink(k), k.rejected, k.allowed]))),
          h("section", {}, h("h2", {}, "Tenants most rejected"),
            table(["tenant", "rejected#", "allowed#"], o.top_tenants.map((t) => [
              h("a", { href: "#usage?tenant=" + encodeURIComponent(t.tenant) }, tenantName(t.tenant, ownTenants)), t.rejected, t.allowed])))),
        h("h2", {}, "Penalties in force"),
        penaltyTable(o.penalties),
        h("section", { id: "ov-gateways" }, h("h2", {}, "Gateways"), gatewayTable(o.gateways)),
        h("p", { class: "small" }, "Updated " + new Date(o.time).toLocaleTimeString() + "; refreshes every 2 s."));
      setStatus("");
    };
    await draw();
    pollTimer = setInterval(draw, 2000);
  }

  function card(label, value, sub, id) {
    return h("div", { class: "card", id }, h("div", { class: "label" }, label), h("div", { class: "value" }, value),
      sub ? h("div", { class: "small" }, sub) : null);
  }

  // ago says how long ago a number of seconds was, in words.
  function ago(sec) {
    sec = Math.round(sec);
    if (sec < 90) return sec + " s ago";
    if (sec < 5400) return Math.round(sec / 60) + " min ago";
    return Math.round(sec / 3600) + " h ago";
  }

  // gatewayTable lists the gateways with their rules version, marked in
  // words (and a symbol) when it is not the active one.
  function gatewayTable(g) {
    if (!g) return h("p", { class: "small" }, "The gateways announce themselves through NATS, which this aggregator does not reach now.");
    return table(["gateway", "region", "rules version", "rules from", "last seen"], g.gateways.map((w) => [
      w.id, w.region,
      w.current ? h("span", { class: "current" }, "v" + w.rules_version + " ✓ current") :
        h("span", { class: "behind" }, "v" + w.rules_version + " ⚠ behind (active v" + g.rules_version + ")"),
      w.rules_source,
      h("span", { class: w.stale ? "behind" : null, title: w.last_seen }, ago(w.age_seconds) + (w.stale ? " ⚠ stale" : ""))]),
    g.count + " gateway" + (g.count === 1 ? "" : "s") + ", " + g.current + " on the active rules version v" + g.rules_version +
      (g.corrupt_entries ? "; " + g.corrupt_entries + " unreadable entries skipped" : ""));
  }

  const levelNames = { 1: "1 reduced limit", 2: "2 cooldown", 3: "3 blocked" };
  function penaltyTable(ps) {
    return table(["level", "tenant", "key", "since", "expires"], ps.map((p) => [
      h("span", { class: "level" }, levelNames[p.level] || String(p.level)), keyTenant(p.tenant, p.key_id, p.key_prefix),
      h("a", { href: "#penalties?key=" + encodeURIComponent("kid:" + p.key_id) }, p.key_prefix || p.key_id), p.since, p.expires_at]));
  }

  // ---- usage -------------------------------------------------------------

  function isoMinutesAgo(m) { return new Date(Date.now() - m * 60000).toISOString().replace(/\.\d+Z$/, "Z"); }

  async function usage(params) {
    const tenant = h("input", { id: "u-tenant", value: params.get("tenant") || "" });
    const key = h("input", { id: "u-key", value: params.get("key") || "", placeholder: "API key or kid:…" });
    const gran = h("select", { id: "u-gran" }, ["minute", "hour", "day"].map((g) => h("option", { value: g, selected: g === (params.get("granularity") || "minute") }, g)));
    const from = h("input", { id: "u-from", value: params.get("from") || isoMinutesAgo(60) });
    const to = h("input", { id: "u-to", value: params.get("to") || isoMinutesAgo(-1) });
    const out = h("div", { id: "u-out" });
    const form = h("form", { class: "row" }, field("Tenant", tenant), field("or key", key), field("Granularity", gran),
      field("From (RFC 3339)", from), field("To", to), h("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
    show("Usage", h("p", { class: "small" }, "Decisions per window from the usage reports; download them as JSON or CSV."), form, out);
    async function load() {
      const path = tenant.value.trim() ? "/v1/usage/tenants/" + keyPath(tenant.value) :
        key.value.trim() ? "/v1/usage/keys/" + keyPath(key.value) : "";
      if (!path) { message(out, false, "Name a tenant or a key."); return; }
      const q = new URLSearchParams({ granularity: gran.value, from: from.value.trim(), to: to.value.trim() });
      try {
        const r = (await api("GET", path + "?" + q)).body;
        const byStart = new Map();
        for (const row of r.rows) {
          const b = byStart.get(row.window_start) || { allowed: 0, rejected: 0 };
          b.allowed += row.allowed; b.rejected += row.rejected;
          byStart.set(row.window_start, b);
        }
        out.replaceChildren(
          h("div", { class: "cards" }, card("Allowed", fmt(r.totals.allowed), "", "u-allowed"), card("Rejected", fmt(r.totals.rejected), "", "u-rejected"),
            card("Cost", fmt(r.totals.cost), "", "u-cost")),
          h("div", { class: "buttons" },
            h("a", { href: path + "?" + q + "&format=json", download: "usage.json", id: "u-json" }, "Download JSON"),
            h("a", { href: path + "?" + q + "&format=csv", download: "usage.csv", id: "u-csv" }, "Download CSV")),
          usageChart([...byStart.entries()]),
          table(["window", "key", "endpoint", "allowed#", "rejected#", "cost#"], r.rows.map((x) => [x.window_start, x.key_prefix || x.key_id, x.endpoint, x.allowed, x.rejected, x.cost])));
      } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    }
    if (tenant.value || key.value) await load();
  }

  // usageChart: a bar per window, allowed solid and rejected hatched on
  // top, with a legend in words.
  function usageChart(windows) {
    const w = 1000, ht = 240, pad = 40;
    const max = Math.max(1, ...windows.map(([, b]) => b.allowed + b.rejected));
    const bw = windows.length ? (w - 2 * pad) / windows.length : 0;
    const svg = s("svg", { viewBox: `0 0 ${w} ${ht}`, class: "chart", role: "img", "aria-label": "allowed and rejected decisions per window" },
      s("defs", {}, s("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
        s("rect", { width: 6, height: 6, fill: "#ffffff" }), s("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#a40e26", "stroke-width": 3 }))));
    const y = (v) => ((ht - pad) * v) / max;
    windows.forEach(([start, b], i) => {
      const x = pad + i * bw + 1, bottom = ht - pad;
      svg.append(s("rect", { class: "allowed", x, y: bottom - y(b.allowed), width: Math.max(1, bw - 2), height: y(b.allowed) },
        s("title", {}, start + ": " + b.allowed + " allowed")));
      svg.append(s("rect", { class: "rejected", x, y: bottom - y(b.allowed) - y(b.rejected), width: Math.max(1, bw - 2), height: y(b.rejected) },
        s("title", {}, start + ": " + b.rejected + " rejected")));
    });
    svg.append(s("text", { x: 2, y: 12 }, fmt(max)), s("text", { x: 2, y: ht - pad }, "0"));
    if (windows.length) {
      svg.append(s("text", { x: pad, y: ht - 10 }, windows[0][0]), s("text", { x: w - pad - 150, y: ht - 10 }, windows[windows.length - 1][0]));
    }
    return h("figure", {}, svg, h("figcaption", { class: "legend" }, "Solid bars: allowed. Hatched bars with a red outline: rejected."));
  }

  // ---- rules -------------------------------------------------------------

  // lineDiff returns [op, line] with op " ", "+" or "-" (LCS; inputs are
  // bounded by the API's ruleset size).
  function lineDiff(a, b) {
    const n = a.length, m = b.length;
    if (n * m > 4e6) return [["!", "too large to diff here"]];
    const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; } else if (L[i + 1][j] >= L[i][j + 1]) out.push(["-", a[i++]]); else out.push(["+", b[j++]]);
    }
    while (i < n) out.push(["-", a[i++]]);
    while (j < m) out.push(["+", b[j++]]);
    return out;
  }

  async function rules() {
    const editor = h("textarea", { id: "r-editor", spellcheck: "false", "aria-label": "ruleset (YAML or JSON)" });
    const reason = h("input", { id: "r-reason", placeholder: "why (audit log)" });
    const out = h("div", { id: "r-out" });
    const versions = h("div", { id: "r-versions" });
    let running = "", etag = "";
    const info = h("p", { class: "small", id: "r-info" });
    async function loadRunning() {
      try {
        const r = await api("GET", "/admin/v1/rules");
        running = typeof r.body === "string" ? r.body : JSON.stringify(r.body, null, 2);
        etag = r.headers.get("ETag") || "";
        info.textContent = "Running version " + (r.headers.get("X-Tollgate-Rules-Version") || "?") + ". Edit, validate, look at the diff, then save.";
      } catch (e) {
        if (e.status === 404) { running = ""; etag = ""; info.textContent = "No ruleset yet."; } else throw e;
      }
      editor.value = running;
    }
    async function loadVersions() {
      const v = (await api("GET", "/admin/v1/rules/versions")).body;
      versions.replaceChildren(table(["version", "time", "actor", "reason", "rules#", ""], v.versions.slice().reverse().map((x) => [
        x.corrupt ? "corrupt (revision " + x.revision + ")" : x.version, x.time || "", x.actor || "", x.reason || "", x.rules ?? "",
        x.corrupt ? "" : changeButton("Roll back to " + x.version, { class: "secondary", onclick: () => rollback(x.version) })])));
    }
    async function rollback(v) {
      if (!confirm("Roll back to version " + v + "? Every gateway applies it at once.")) return;
      try {
        const r = (await api("POST", "/admin/v1/rules/rollback", { version: v, reason: reason.value || "console rollback" })).body;
        message(out, true, "Rolled back: version " + r.version + " holds version " + v + "'s rules.");
        await loadRunning(); await loadVersions();
      } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    }
    function problems(e, what) {
      message(out, false, what + ": " + e.message);
    }
    const validate = h("button", { type: "button", id: "r-validate", class: "secondary", onclick: async () => {
      try {
        const r = (await api("POST", "/admin/v1/rules/validate", editor.value)).body;
        message(out, true, "Valid: " + r.rules + " rules.");
      } catch (e) { if (e.status !== 401) problems(e, "Invalid"); }
    } }, "Validate");
    const diff = h("button", { type: "button", id: "r-diff", class: "secondary", onclick: () => {
      const d = lineDiff(running.split("\n"), editor.value.split("\n"));
      const changed = d.filter(([op]) => op !== " ").length;
      out.replaceChildren(h("h2", {}, changed ? changed + " lines differ from the running version" : "No difference from the running version"),
        h("pre", { class: "diff", id: "r-diff-out" }, d.filter(([op], i) => op !== " " || d.slice(Math.max(0, i - 2), i + 3).some(([o]) => o !== " "))
          .map(([op, line]) => h("span", { class: op === "+" ? "add" : op === "-" ? "del" : null }, op + " " + line + "\n"))));
    } }, "Diff against running");
    const save = changeButton("Save", { id: "r-save", onclick: async () => {
      const headers = etag ? { "If-Match": etag } : {};
      try {
        const r = (await api("PUT", "/admin/v1/rules?reason=" + encodeURIComponent(reason.value || "console edit"), editor.value, headers)).body;
        message(out, true, "Saved as version " + r.version + ": every gateway applies it at once.");
        await loadRunning(); await loadVersions();
      } catch (e) {
        if (e.status === 412) message(out, false, "Someone else changed the rules first (" + e.message + "). Copy your edit, reload, and apply it again.");
        else if (e.status !== 401) problems(e, "Not saved");
      }
    } });
    const reload = h("button", { type: "button", class: "secondary", onclick: async () => { await loadRunning(); out.replaceChildren(); } }, "Reload running");
    show("Rules", info, editor, h("form", { class: "row", onsubmit: (ev) => ev.preventDefault() }, field("Reason", reason)),
      h("div", { class: "buttons" }, validate, diff, save, reload), out, h("h2", {}, "Versions"), versions);
    await loadRunning();
    await loadVersions();
  }

  // ---- lists -------------------------------------------------------------

  async function lists(params) {
    const list = h("select", { id: "l-list" }, ["blocklist", "allowlist", "overrides"].map((l) => h("option", { value: l, selected: l === params.get("list") }, l)));
    const key = h("input", { id: "l-key", value: params.get("key") || "", placeholder: "API key, kid:… or tenant:…", required: true });
    const ttl = h("input", { id: "l-ttl", placeholder: "10m (empty: no expiry)" });
    const reason = h("input", { id: "l-reason", placeholder: "why (audit log)" });
    const limit = h("input", { id: "l-limit", inputmode: "numeric", placeholder: "overrides: limit" });
    const factor = h("input", { id: "l-factor", inputmode: "decimal", placeholder: "or factor" });
    const out = h("div", { id: "l-out" });
    const path = () => "/admin/v1/" + list.value + "/" + keyPath(key.value);
    async function look() {
      try {
        const r = await api("GET", path());
        out.replaceChildren(h("h2", {}, "Entry"), h("pre", { id: "l-entry" }, JSON.stringify(r.body, null, 2)));
      } catch (e) { if (e.status !== 401) message(out, false, e.status === 404 ? "No " + list.value + " entry for this key." : e.message); }
    }
    const put = changeButton("Add / replace", { id: "l-put", onclick: async () => {
      const body = { reason: reason.value || undefined, ttl: ttl.value || undefined };
      if (list.value === "overrides") {
        if (limit.value) body.limit = Number(limit.value);
        if (factor.value) body.factor = Number(factor.value);
      }
      try {
        await api("PUT", path(), body);
        message(out, true, "Done: every gateway applies it at once.");
      } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    } });
    const del = changeButton("Remove", { id: "l-delete", class: "danger", onclick: async () => {
      try {
        await api("DELETE", path() + "?reason=" + encodeURIComponent(reason.value || "console"));
        message(out, true, "Removed.");
      } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    } });
    const form = h("form", { class: "row" }, field("List", list), field("Key", key), field("TTL", ttl), field("Reason", reason),
      field("Limit", limit), field("Factor", factor), h("button", { type: "submit", class: "secondary", id: "l-look" }, "Look up"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); look(); });
    show("Blocklist, allowlist, overrides",
      h("p", { class: "small" }, "A blocked key is refused 403 KEY_BLOCKED by every gateway; an allowlisted key bypasses every limit; an override sets a key's limit (or a factor of it). A TTL ends the entry on its own."),
      form, h("div", { class: "buttons" }, put, del), out);
    if (key.value) await look();
  }

  // ---- penalties ---------------------------------------------------------

  async function penalties(params) {
    const key = h("input", { id: "p-key", value: params.get("key") || "", placeholder: "API key or kid:…" });
    const reason = h("input", { id: "p-reason", placeholder: "why (audit log)" });
    const out = h("div", { id: "p-out" });
    const note = h("div", { id: "p-note" });
    const inForce = h("div", { id: "p-list" });
    async function look() {
      if (!key.value.trim()) return;
      try {
        const p = (await api("GET", "/admin/v1/penalties/" + keyPath(key.value))).body;
        out.replaceChildren(
          h("div", { class: "cards" }, card("Level", p.level ? (levelNames[p.level] || String(p.level)) : "0 · none", p.action || "", "p-level"),
            card("Expires", p.expires_at || "—", "", "p-expires")),
          h("div", { class: "buttons" }, changeButton("Lift the penalty", { id: "p-lift", class: "danger", onclick: lift })),
          h("h2", {}, "History and evidence"),
          table(["time", "change", "level", "by", "evidence"], (p.history || []).slice().reverse().map((st) => [st.time, st.change,
            st.previous_level + " → " + st.level, st.actor + (st.reason ? " (" + st.reason + ")" : ""),
            st.evidence ? h("pre", {}, JSON.stringify(st.evidence, null, 1)) : ""])));
      } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    }
    async function lift() {
      try {
        const r = await api("DELETE", "/admin/v1/penalties/" + keyPath(key.value) + "?reason=" + encodeURIComponent(reason.value || "console lift"));
        await look();
        message(note, true, r.status === 202 ? "Lift sent; it applies within seconds." : "Lifted: level " + r.body.level + ".");
      } catch (e) { if (e.status !== 401) message(note, false, e.message); }
    }
    const form = h("form", { class: "row" }, field("Key", key), field("Reason", reason), h("button", { type: "submit", id: "p-look" }, "Look up"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); look(); });
    show("Penalties", h("p", { class: "small" }, "Keys climb the penalty ladder on abuse (1 reduced limit, 2 cooldown, 3 blocked) and step down when quiet; lifting resets a key's level and evidence."),
      h("h2", {}, "In force"), inForce, h("h2", {}, "A key"), form, note, out);
    try { inForce.replaceChildren(penaltyTable((await api("GET", "/admin/v1/overview?limit=1")).body.penalties)); } catch (e) { if (e.status !== 401) message(inForce, false, e.message); }
    await look();
  }

  // ---- keys --------------------------------------------------------------

  async function keys(params) {
    const key = h("input", { id: "k-key", value: params.get("key") || "", placeholder: "API key or kid:…" });
    const endpoint = h("input", { id: "k-endpoint", value: params.get("endpoint") || "/", placeholder: "/v1/users/42" });
    const method = h("input", { id: "k-method", value: "GET" });
    const tokens = h("input", { id: "k-tokens", inputmode: "numeric", placeholder: "tokens" });
    const out = h("div", { id: "k-out" });
    const note = h("div", { id: "k-note" });
    const q = () => new URLSearchParams({ endpoint: endpoint.value || "/", method: method.value || "GET" });
    async function look() {
      if (!key.value.trim()) return;
      try {
        const k = (await api("GET", "/admin/v1/keys/" + keyPath(key.value) + "?" + q())).body;
        out.replaceChildren(
          h("p", {}, "Key ", h("strong", {}, k.key_prefix || k.key_id), " of tenant ", h("strong", {}, keyTenant(k.tenant, k.key_id, k.key_prefix)),
            ", tier ", h("strong", {}, k.tier || "—"), ": a request to ", k.endpoint, " would be ", h("strong", { id: "k-status" }, String(k.status)),
            k.reason ? " (" + k.reason + ")" : ""),
          table(["rule", "algorithm", "limit#", "remaining#", "would allow", "retry after", "reset"], (k.rules || []).map((r) => [
            r.id, r.algorithm, r.limit, r.remaining, r.would_allow ? "yes" : "no", r.retry_after ?? "", r.reset ?? ""])));
      } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    }
    const reset = changeButton("Reset counters", { id: "k-reset", class: "secondary", onclick: async () => {
      try { await api("POST", "/admin/v1/keys/" + keyPath(key.value) + "/reset", { endpoint: endpoint.value, method: method.value, reason: "console" }); message(note, true, "Counters reset."); await look(); } catch (e) { if (e.status !== 401) message(note, false, e.message); }
    } });
    const grant = changeButton("Grant tokens", { id: "k-grant", class: "secondary", onclick: async () => {
      try { await api("POST", "/admin/v1/keys/" + keyPath(key.value) + "/quota", { tokens: Number(tokens.value), endpoint: endpoint.value, method: method.value, reason: "console" }); message(note, true, "Granted " + tokens.value + "."); await look(); } catch (e) { if (e.status !== 401) message(note, false, e.message); }
    } });
    const form = h("form", { class: "row" }, field("Key", key), field("Endpoint", endpoint), field("Method", method),
      h("button", { type: "submit", id: "k-look" }, "Look up"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); look(); });
    show("Key lookup", h("p", { class: "small" }, "The state of every rule that applies to a key, read without consuming anything."),
      form, h("form", { class: "row", onsubmit: (ev) => ev.preventDefault() }, field("Tokens to grant", tokens), grant, reset), note, out);
    await look();
  }

  // ---- audit -------------------------------------------------------------

  async function audit(params) {
    const kind = h("select", { id: "a-kind" }, ["", "rules", "rollback", "blocklist", "allowlist", "override", "penalty", "reset", "quota"].map((k) =>
      h("option", { value: k, selected: k === (params.get("kind") || "") }, k || "any kind")));
    const key = h("input", { id: "a-key", value: params.get("key") || "", placeholder: "API key or kid:…" });
    const text = h("input", { id: "a-text", placeholder: "actor, reason, subject…" });
    const from = h("input", { id: "a-from", placeholder: "RFC 3339" });
    const out = h("div", { id: "a-out" });
    let entries = [];
    function render() {
      const needle = text.value.trim().toLowerCase();
      const shown = needle ? entries.filter((e) => JSON.stringify(e).toLowerCase().includes(needle)) : entries;
      out.replaceChildren(h("p", { class: "small" }, shown.length + " of " + entries.length + " entries"),
        table(["time", "kind", "actor", "subject", "reason", "change"], shown.map((e) => [e.time, e.kind, e.actor, e.key_prefix || e.subject, e.reason || "",
          h("details", {}, h("summary", {}, "before / after" + (e.evidence ? " / evidence" : "")),
            h("pre", {}, JSON.stringify({ before: e.before, after: e.after, evidence: e.evidence }, null, 1)))])));
    }
    async function load() {
      const q = new URLSearchParams({ limit: "500" });
      if (kind.value) q.set("kind", kind.value);
      if (key.value.trim()) q.set("key", key.value.trim());
      if (from.value.trim()) q.set("from", from.value.trim());
      try { entries = (await api("GET", "/admin/v1/audit?" + q)).body.entries.slice().reverse(); render(); } catch (e) { if (e.status !== 401) message(out, false, e.message); }
    }
    const form = h("form", { class: "row" }, field("Kind", kind), field("Key", key), field("From", from), field("Search", text),
      h("button", { type: "submit", id: "a-search" }, "Search"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
    text.addEventListener("input", render);
    show("Audit log", h("p", { class: "small" }, "Every change — rules, lists, overrides, penalties, resets, quota — with who, why, when, before and after."), form, out);
    await load();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
