// tether dashboard, run page: curves drawn with uPlot, fed by polling metrics.json
// (only the rows stored since the last poll) every 2 s while the run is running; the
// events table is redrawn whenever the feed sends it (new points, or the run's end).
(function () {
  "use strict";
  var box = document.getElementById("charts");
  if (!box || typeof uPlot === "undefined" || typeof tetherAxes === "undefined") return;
  var A = tetherAxes; // static/axes.js
  var layout = JSON.parse(box.dataset.charts || "{}");
  var feed = box.dataset.feed;
  var colors = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  var values = {}; // metric name -> {step: value}
  var charts = {}; // title -> {def, plot, el}
  var last = 0;
  var total = 0;

  function titleOf(name) {
    for (var i = 0; i < layout.charts.length; i++) {
      if (layout.charts[i].series.indexOf(name) >= 0) return layout.charts[i];
    }
    if (layout.hidden.indexOf(name) >= 0) return null;
    var def = { title: name, series: [name] };
    layout.charts.push(def);
    return def;
  }
  function columns(def) {
    var steps = {};
    def.series.forEach(function (n) { Object.keys(values[n] || {}).forEach(function (s) { steps[s] = 1; }); });
    var xs = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    var data = [xs];
    def.series.forEach(function (n) {
      var v = values[n] || {};
      data.push(xs.map(function (s) { return s in v ? v[s] : null; }));
    });
    return data;
  }
  function chartWidth() {
    // three charts a row on a wide window, two on a narrower one, else one
    var w = box.clientWidth, cols = w >= 1100 ? 3 : (w >= 700 ? 2 : 1);
    return Math.max(Math.floor((w - 12 * (cols - 1)) / cols) - 12, 260);
  }
  function ensure(def) {
    if (charts[def.title]) return charts[def.title];
    var el = document.createElement("div");
    el.className = "chart";
    el.dataset.title = def.title;
    var h = document.createElement("h3");
    h.textContent = def.title;
    el.appendChild(h);
    // keep the layout's order: insert before the first chart that comes later
    var order = layout.charts.indexOf(def), before = null;
    Object.keys(charts).forEach(function (t) {
      var c = charts[t];
      if (layout.charts.indexOf(c.def) > order && (!before || layout.charts.indexOf(c.def) < layout.charts.indexOf(before.def))) before = c;
    });
    box.insertBefore(el, before ? before.el : null);
    var series = [{ label: "step" }];
    def.series.forEach(function (n, i) {
      series.push({ label: n, stroke: colors[i % colors.length], width: 1.5, spanGaps: true, points: { show: true, size: 4 } });
    });
    var plot = new uPlot({
      width: chartWidth(), height: 200,
      scales: {
        x: { time: false, range: function (u, min, max) { return A.xRange(min, max); } },
        y: { range: function (u, min, max) { return A.yRange(min, max); } },
      },
      series: series,
      axes: [
        { label: "step", size: 36, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] },
        { size: 60, values: function (u, splits) { return A.ticks(splits); } },
      ],
      legend: { live: true },
    }, columns(def), el);
    charts[def.title] = { def: def, plot: plot, el: el };
    return charts[def.title];
  }
  function apply(points) {
    var touched = {};
    points.forEach(function (p) {
      var step = p[0], name = p[1], value = p[2];
      var def = titleOf(name);
      if (!def) return;
      (values[name] = values[name] || {})[step] = value;
      touched[def.title] = def;
    });
    Object.keys(touched).forEach(function (t) {
      var c = ensure(touched[t]);
      var data = columns(c.def);
      c.plot.setData(data);
      c.el.dataset.points = String(data[0].length);
    });
    total += points.length;
    box.dataset.points = String(total);
    var empty = document.getElementById("no-metrics");
    if (empty && total) empty.hidden = true;
  }
  function showEvents(list) {
    var table = document.getElementById("events");
    var none = document.getElementById("no-events");
    if (!table) return;
    var body = table.tBodies[0];
    while (body.firstChild) body.removeChild(body.firstChild);
    list.forEach(function (e) {
      var tr = document.createElement("tr");
      tr.className = "ev " + e.kind;
      [e.step === null ? "" : String(e.step), e.kind, e.text].forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text; // never markup: the text may hold a path or a message
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    table.hidden = list.length === 0;
    if (none) none.hidden = list.length > 0;
  }
  function poll() {
    fetch(feed + "?after=" + last, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); throw new Error("logged out"); }
        return r.json();
      })
      .then(function (d) {
        last = d.last;
        apply(d.points);
        if (d.events) showEvents(d.events);
        Object.keys(d.head || {}).forEach(function (k) {
          var el = document.querySelector('[data-field="' + k + '"]');
          if (el) el.textContent = d.head[k];
        });
        var st = document.getElementById("run-status");
        if (st) { st.textContent = d.status; st.className = "status " + d.status; }
        var live = document.getElementById("live");
        if (d.status === "running") {
          setTimeout(poll, 2000);
        } else if (live) {
          live.textContent = "ended";
          live.className = "live ended";
        }
        box.dataset.polls = String(Number(box.dataset.polls || 0) + 1);
      })
      .catch(function () { setTimeout(poll, 5000); });
  }
  poll();
})();
