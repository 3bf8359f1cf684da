"use strict";
// The status page's script. Every value from the server is written as text (textContent, new Option),
// never as markup: names come from bundle manifests. The admin token lives in this page's memory only
// (never stored, never in a URL) and goes out as an Authorization header of same-origin fetches.
(function () {
  const REFRESH_MS = 5000;
  let token = "";
  let served = [];

  const $ = (id) => document.getElementById(id);

  function cell(row, value, numeric) {
    const td = document.createElement("td");
    td.textContent = value === null || value === undefined ? "-" : String(value);
    if (numeric) td.className = "num";
    row.appendChild(td);
    return td;
  }

  function fill(tableId, rows, columns) {
    // columns: [key or function, numeric?]
    const body = $(tableId).tBodies[0];
    body.replaceChildren();
    for (const item of rows) {
      const tr = document.createElement("tr");
      for (const [key, numeric] of columns) cell(tr, typeof key === "function" ? key(item) : item[key], numeric);
      body.appendChild(tr);
    }
  }

  function seconds(s) {
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function when(t) {
    return typeof t === "number" && t > 0 ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "-";
  }

  function figures(pairs) {
    return pairs.map(([k, v]) => k + " " + (typeof v === "number" ? +v.toFixed(4) : "-")).join(", ");
  }

  async function getJSON(path, withToken) {
    const headers = { Accept: "application/json" };
    if (withToken) headers.Authorization = "Bearer " + token;
    const r = await fetch(path, { headers: headers, cache: "no-store", credentials: "omit" });
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    return { status: r.status, body: body };
  }

  // -- the public part -------------------------------------------------------------------------
  async function refreshPublic() {
    let answer;
    try {
      answer = await getJSON("status", false);
    } catch (e) {
      $("state").textContent = "unreachable";
      $("state").className = "down";
      return;
    }
    if (answer.status !== 200 || !answer.body) return;
    const s = answer.body;
    $("state").textContent = s.ready ? "up, ready" : "up, not ready";
    $("state").className = s.ready ? "up" : "waiting";
    $("uptime").textContent = "for " + seconds(s.uptime_s);
    const list = $("served");
    list.replaceChildren();
    for (const item of s.served) {
      const li = document.createElement("li");
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = item.name;
      const kind = document.createElement("span");
      kind.className = "kind";
      kind.textContent = " " + item.kind;
      li.append(name, kind);
      list.appendChild(li);
    }
    if (!s.served.length) list.textContent = "nothing is served";
    $("served-more").textContent = s.more ? "and " + s.more + " more" : "";
    if (s.details === "off") $("details-message").textContent = "Details are off: the server has no admin token.";
    served = s.served;
    targets();
  }

  function targets() {
    const select = $("try-target");
    const wanted = served.filter((s) => s.kind === "pipeline" || s.kind === "next_items");
    const before = select.value;
    const now = wanted.map((s) => s.name + "\u0000" + s.kind).join("\u0001");
    if (select.dataset.names === now) return;
    select.dataset.names = now;
    select.replaceChildren(...wanted.map((s) => {
      const option = new Option(s.name + " (" + s.kind + ")", s.name);
      option.dataset.kind = s.kind;
      return option;
    }));
    if (wanted.some((s) => s.name === before)) select.value = before;
    $("try-submit").disabled = !wanted.length;
    $("try-message").textContent = wanted.length ? "" : "No pipeline or next-items model is served.";
    checkTimes();
  }

  // -- the details (admin token) ---------------------------------------------------------------
  async function refreshDetails() {
    if (!token) return;
    let answer;
    try {
      answer = await getJSON("status/details", true);
    } catch (e) {
      $("details-message").textContent = "The server did not answer.";
      return;
    }
    const message = $("details-message");
    if (answer.status !== 200) {
      if (answer.status === 401 || answer.status === 403) token = "";  // refused: not sent again
      message.textContent = (answer.body && answer.body.error) || "refused (" + answer.status + ")";
      message.className = "note error";
      $("details").hidden = true;
      return;
    }
    message.textContent = "";
    message.className = "note";
    $("details").hidden = false;
    showDetails(answer.body);
  }

  function showDetails(d) {
    const versions = [];
    for (const name of d.served) {
      for (const v of name.versions) {
        versions.push({
          name: name.name, kind: v.kind, version: v.version, role: v.role,
          share: v.role === "canary" ? name.canary_share : null, bundle: v.bundle_id,
        });
      }
    }
    fill("versions", versions, [["name"], ["kind"], ["version"], ["role"], ["share", true], ["bundle"]]);
    $("traffic-window").textContent = "(the last " + seconds(d.traffic.window_s) + ")";
    fill("traffic", d.traffic.rows, [
      ["model"], ["endpoint"], ["rate_per_s", true], ["requests", true], ["4xx", true], ["5xx", true],
      ["p50_ms", true], ["p99_ms", true],
      [(r) => Object.entries(r.versions).map(([v, n]) => v + ": " + n).join(", ")],
    ]);
    const loop = d.loop;
    $("loop-log").textContent = loop.log === null
      ? "No decision log: start the server with --decision-log (hugerec loop's embedded server shows its own)."
      : "Decision log " + loop.log;
    const problems = $("loop-problems");
    problems.replaceChildren(...loop.problems.map((p) => { const li = document.createElement("li"); li.textContent = p; return li; }));
    if (loop.drift) {
      $("drift-title").textContent = "(window " + loop.drift.window + ": " + loop.drift.reason + ")";
      fill("drift", loop.drift.psi, [[(p) => p[0]], [(p) => (typeof p[1] === "number" ? +p[1].toFixed(4) : "-"), true]]);
    } else {
      $("drift-title").textContent = "(no retraining in the recent decisions)";
      fill("drift", [], []);
    }
    fill("decisions", loop.records, [
      [(r) => when(r.time)], ["window", true], ["action"], ["version"], ["reason"], [(r) => figures(r.figures)],
    ]);
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";  // kept in memory only
    if (!token) return;
    $("details-message").textContent = "Loading...";
    refreshDetails();
  });

  $("token-forget").addEventListener("click", () => {
    token = "";
    $("token").value = "";
    $("details").hidden = true;
    $("details-message").textContent = "The versions, the traffic and the loop's decisions need the admin token.";
    $("details-message").className = "note";
  });

  // -- try a recommendation --------------------------------------------------------------------
  const INTEGER = /^-?\d{1,19}$/;

  function digits(text) {
    return text.replace(/^(-?)0+(?=\d)/, "$1");  // JSON numbers have no leading zeros
  }

  function ids(text) {
    const parts = text.split(/[\s,]+/).filter((p) => p.length);
    for (const p of parts) if (!INTEGER.test(p)) throw new Error("history: " + JSON.stringify(p.slice(0, 40)) + " is not an integer id");
    return parts.map(digits);
  }

  function times(text, history) {
    // event times in seconds: integers, one per history id, oldest first (the server checks them again)
    const parts = text.split(/[\s,]+/).filter((p) => p.length);
    for (const p of parts) if (!INTEGER.test(p)) throw new Error("times: " + JSON.stringify(p.slice(0, 40)) + " is not an integer (seconds)");
    if (parts.length !== history.length) {
      throw new Error("times: give one time (seconds) per history id: " + history.length + " ids, " + parts.length + " times");
    }
    const values = parts.map(digits);
    for (let i = 1; i < values.length; i++) {
      if (BigInt(values[i]) < BigInt(values[i - 1])) {
        throw new Error("times: " + values[i] + " (time " + (i + 1) + ") is earlier than " + values[i - 1] + " before it: oldest first");
      }
    }
    return values;
  }

  // Whether a served name reads its items' times: the metadata of one of its versions lists the input
  // ("history.times" of a pipeline, "items.times" of a next-items model; GET /v2/models/NAME/versions/V).
  async function takesTimes(name, kind) {
    const field = kind === "pipeline" ? "history.times" : "items.times";
    const path = "v2/models/" + encodeURIComponent(name);
    const lists = (meta) => meta.status === 200 && meta.body && Array.isArray(meta.body.inputs) && meta.body.inputs.some((i) => i && i.name === field);
    const meta = await getJSON(path, false);
    if (meta.status !== 200 || !meta.body) return false;
    if (lists(meta)) return true;
    const versions = Array.isArray(meta.body.versions) ? meta.body.versions.slice(0, 8) : [];
    for (const v of versions) {
      if (lists(await getJSON(path + "/versions/" + encodeURIComponent(String(v)), false))) return true;  // a canary that reads them
    }
    return false;
  }

  let timesCheck = null;  // { name, kind, promise }: the chosen target's takesTimes

  function showTimes(shown) {
    $("try-times").hidden = !shown;
    $("try-times-label").hidden = !shown;
  }

  function checkTimes() {
    // asks whether the chosen target reads times; the field shows when it does (the latest answer wins)
    const select = $("try-target");
    const option = select.options[select.selectedIndex];
    if (!option) {
      timesCheck = null;
      showTimes(false);
      return Promise.resolve(false);
    }
    const promise = takesTimes(option.value, option.dataset.kind).catch(() => false);
    const check = { name: option.value, kind: option.dataset.kind, promise: promise };
    timesCheck = check;
    promise.then((shown) => { if (timesCheck === check) showTimes(shown); });
    return promise;
  }

  function request(kind, name, user, history, k, seconds) {
    // the JSON is written from the validated digits, so that ids beyond 2^53 keep every digit
    if (kind === "pipeline") {
      const fields = ['"pipeline":' + JSON.stringify(name), '"user":' + user, '"k":' + k];
      if (history.length) fields.push('"history":[' + history.join(",") + "]");
      if (seconds && history.length) fields.push('"history.times":[' + seconds.join(",") + "]");
      return { url: "recommend", body: "{" + fields.join(",") + "}" };
    }
    if (!history.length) throw new Error("a next-items model needs a history");
    const timed = seconds
      ? ',{"name":"items.times","datatype":"INT64","shape":[' + seconds.length + '],"data":[' + seconds.join(",") + "]}"
      : "";
    const inputs = '[{"name":"items","datatype":"INT64","shape":[' + history.length + '],"data":[' + history.join(",") + "]}," +
      '{"name":"items.lengths","datatype":"INT64","shape":[1],"data":[' + history.length + "]}" + timed + "]";
    return {
      url: "v2/models/" + encodeURIComponent(name) + "/infer",
      body: '{"inputs":' + inputs + ',"parameters":{"k":' + k + "}}",
    };
  }

  function items(kind, answer) {
    if (kind === "pipeline") {
      return answer.items.map((item, i) => ({ item: item, score: answer.scores[i], source: answer.sources[i] }));
    }
    const out = {};
    for (const o of answer.outputs) out[o.name] = o.data;
    return out.items.map((item, i) => ({ item: item, score: out.scores[i], source: "" })).filter((r) => r.item !== -1);
  }

  $("try-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = $("try-message");
    const select = $("try-target");
    const option = select.options[select.selectedIndex];
    fill("try-items", [], []);
    message.className = "note";
    if (!option) return;
    let call;
    try {
      const user = $("try-user").value.trim();
      const k = $("try-k").value.trim();
      if (!INTEGER.test(user)) throw new Error("user: give an integer id");
      if (!/^\d{1,4}$/.test(k) || +k < 1) throw new Error("k: give an integer from 1");
      const history = ids($("try-history").value);
      const current = timesCheck && timesCheck.name === option.value && timesCheck.kind === option.dataset.kind;
      const timed = await (current ? timesCheck.promise : checkTimes());
      const seconds = timed ? times($("try-times").value, history) : null;
      call = request(option.dataset.kind, option.value, digits(user), history, String(+k), seconds);
    } catch (e) {
      message.textContent = e.message;
      message.className = "note error";
      return;
    }
    message.textContent = "Asking...";
    let r, answer;
    try {
      r = await fetch(call.url, {
        method: "POST", body: call.body, cache: "no-store", credentials: "omit",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
      });
      answer = await r.json();
    } catch (e) {
      message.textContent = "The server did not answer.";
      message.className = "note error";
      return;
    }
    if (!r.ok) {
      message.textContent = (answer && answer.error) || "refused (" + r.status + ")";
      message.className = "note error";
      return;
    }
    const rows = items(option.dataset.kind, answer);
    const notes = answer.notes && answer.notes.length ? " " + answer.notes.join("; ") : "";
    const version = answer.version || answer.model_version || "";
    message.textContent = rows.length + " items from version " + version + (answer.cold_start ? " (cold start)" : "") + "." + notes;
    fill("try-items", rows.map((row, i) => ({ rank: i + 1, ...row })), [
      ["rank", true], ["item", true], [(r) => (typeof r.score === "number" ? +r.score.toFixed(5) : "-"), true], ["source"],
    ]);
  });

  $("try-target").addEventListener("change", checkTimes);

  refreshPublic();
  setInterval(() => { refreshPublic(); refreshDetails(); }, REFRESH_MS);
})();
