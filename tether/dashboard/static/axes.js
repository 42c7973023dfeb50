// tether dashboard: the run page's axis scales and tick labels (run.js uses them).
// Metrics span 1e-9 (a KL, a logprob gap) to 1e5 (tokens/s): uPlot's default labels
// round a tiny value to "0" on every tick, a constant series gets a zero-height range
// and a single step an arbitrary one. These keep every tick distinct and readable.
(function (root) {
  "use strict";
  // decimals that show a tick spacing exactly (0.25 -> 2, 50 -> 0), at most 8
  function decimals(step) {
    var d = 0;
    while (d < 8 && Math.abs(Math.round(step * Math.pow(10, d)) - step * Math.pow(10, d)) > 1e-6) d++;
    return d;
  }
  // tick labels: scientific where values are tiny or huge, else just enough decimals
  function ticks(splits) {
    var vals = splits.filter(function (v) { return v !== null && isFinite(v); });
    if (!vals.length) return splits.map(function () { return ""; });
    var big = Math.max.apply(null, vals.map(Math.abs));
    var step = vals.length > 1 ? Math.abs(vals[1] - vals[0]) : (big || 1);
    var sci = big !== 0 && (big < 1e-3 || big >= 1e6);
    return splits.map(function (v) {
      if (v === null || !isFinite(v)) return "";
      if (Math.abs(v) < step * 1e-6) return "0"; // zero, up to float noise
      if (sci) { // one exponent on every tick: 4.4e-7, 4.6e-7; 0.2e-9 ... 1.0e-9
        var e = Math.floor(Math.log10(big)), unit = Math.pow(10, e);
        return (v / unit).toFixed(Math.min(decimals(step / unit), 4)) + "e" + e;
      }
      return v.toFixed(decimals(step));
    });
  }
  // y range: a constant series (or one point) gets +-10% of its value (+-1 around 0),
  // anything else its span with 5% either side
  function yRange(min, max) {
    if (min === null || max === null || !isFinite(min) || !isFinite(max)) return [0, 1];
    if (min === max) {
      var pad = min === 0 ? 1 : Math.abs(min) * 0.1;
      return [min - pad, max + pad];
    }
    var span = max - min;
    return [min - span * 0.05, max + span * 0.05];
  }
  // x range (steps): one step is shown at the middle of [step - 1, step + 1]
  function xRange(min, max) {
    if (min === null || max === null) return [0, 1];
    return min === max ? [min - 1, max + 1] : [min, max];
  }
  var api = { ticks: ticks, yRange: yRange, xRange: xRange, decimals: decimals };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.tetherAxes = api;
})(this);
