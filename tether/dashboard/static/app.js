// tether dashboard: the token tooltip. Stored text only ever reaches the page through
// textContent (never innerHTML), so a completion containing markup stays text.
(function () {
  "use strict";
  var tip = document.getElementById("tip");
  if (!tip) return;
  function line(text, cls) {
    var div = document.createElement("div");
    if (cls) div.className = cls;
    div.textContent = text;
    return div;
  }
  function show(el, ev) {
    var lp = parseFloat(el.dataset.lp);
    tip.replaceChildren();
    tip.appendChild(line(JSON.stringify(el.textContent), "tok-text"));
    tip.appendChild(line("token id " + el.dataset.id));
    tip.appendChild(line("logprob " + lp.toFixed(4) + "  (p " + Math.exp(lp).toFixed(3) + ")"));
    if (el.dataset.top) {
      var top = [];
      try { top = JSON.parse(el.dataset.top); } catch (e) { top = []; }
      if (top.length) tip.appendChild(line("top alternatives:", "sub"));
      top.forEach(function (alt) {
        tip.appendChild(line(JSON.stringify(String(alt[0])) + "  " + Number(alt[1]).toFixed(4), "alt"));
      });
    }
    tip.hidden = false;
    tip.style.left = Math.min(ev.pageX + 12, window.scrollX + window.innerWidth - 280) + "px";
    tip.style.top = ev.pageY + 16 + "px";
  }
  document.addEventListener("mouseover", function (ev) {
    var el = ev.target.closest ? ev.target.closest(".tok") : null;
    if (el) show(el, ev); else tip.hidden = true;
  });
})();
