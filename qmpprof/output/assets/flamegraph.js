"use strict";
(function () {
  var svg = document.documentElement;
  var total = +svg.getAttribute("data-total"), width = +svg.getAttribute("data-width");
  var pad = +svg.getAttribute("data-pad"), charWidth = +svg.getAttribute("data-char");
  var frames = [], details, matched, unzoom, searchButton, searching = false;

  function num(g, name) { return +g.getAttribute(name); }

  function label(name, w) {
    var chars = Math.floor((w - 6) / charWidth);
    if (chars < 3) { return ""; }
    return name.length <= chars ? name : name.slice(0, chars - 2) + "..";
  }

  function place(g, x, w) {
    var rect = g.querySelector("rect"), text = g.querySelector("text");
    rect.setAttribute("x", x.toFixed(2));
    rect.setAttribute("width", w.toFixed(2));
    text.setAttribute("x", (x + 3).toFixed(2));
    text.textContent = label(g.getAttribute("data-n"), w);
  }

  function zoom(target) {
    var zx = num(target, "data-x"), zw = num(target, "data-w"), zd = num(target, "data-d");
    frames.forEach(function (g) {
      var x = num(g, "data-x"), w = num(g, "data-w"), d = num(g, "data-d");
      var inside = d >= zd && x >= zx && x + w <= zx + zw;
      var above = d < zd && x <= zx && x + w >= zx + zw;
      g.classList.toggle("hide", !inside && !above);
      g.classList.toggle("parent", above);
      if (inside) { place(g, pad + (x - zx) / zw * width, w / zw * width); }
      if (above) { place(g, pad, width); }
    });
    unzoom.classList.toggle("hide", zd === 0);
    svg.setAttribute("data-zoom", target.getAttribute("data-n"));
  }

  function covered(spans) {
    var sum = 0, end = -1;
    spans.sort(function (a, b) { return a[0] - b[0]; });
    spans.forEach(function (s) {
      if (s[0] >= end) { sum += s[1]; end = s[0] + s[1]; }
      else if (s[0] + s[1] > end) { sum += s[0] + s[1] - end; end = s[0] + s[1]; }
    });
    return sum;
  }

  function pattern(term) {
    try { return new RegExp(term); }
    catch (e) { return new RegExp(term.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")); }
  }

  function search(term) {
    var re = pattern(term), spans = [];
    frames.forEach(function (g) {
      var hit = term !== "" && re.test(g.getAttribute("data-n"));
      g.classList.toggle("match", hit);
      if (hit) { spans.push([num(g, "data-x"), num(g, "data-w")]); }
    });
    searching = term !== "";
    searchButton.textContent = searching ? "Reset search" : "Search";
    var share = (100 * covered(spans) / total).toFixed(1);
    matched.textContent = searching ? "Matched: " + share + "% (" + spans.length + " frames)" : "";
  }

  function ask() {
    if (searching) { search(""); return; }
    var term = window.prompt("Search frames (regular expression):", "");
    if (term) { search(term); }
  }

  function fromUrl() {
    var query = new URLSearchParams(window.location.search);
    var hash = new URLSearchParams(window.location.hash.slice(1));
    var term = hash.get("s") || query.get("s");
    if (term) { search(term); }
  }

  function frameOf(event) {
    var node = event.target;
    while (node && node.classList && !node.classList.contains("frame")) { node = node.parentNode; }
    return node && node.classList && node.classList.contains("frame") ? node : null;
  }

  function init() {
    frames = Array.prototype.slice.call(document.querySelectorAll("#frames > .frame"));
    details = document.getElementById("details");
    matched = document.getElementById("matched");
    unzoom = document.getElementById("unzoom");
    searchButton = document.getElementById("search");
    var box = document.getElementById("frames");
    box.addEventListener("click", function (e) { var g = frameOf(e); if (g) { zoom(g); } });
    box.addEventListener("mouseover", function (e) {
      var g = frameOf(e);
      details.textContent = g ? g.querySelector("title").textContent : " ";
    });
    box.addEventListener("mouseout", function () { details.textContent = " "; });
    unzoom.addEventListener("click", function () { zoom(frames[0]); });
    if (!frames.length) { return; }
    searchButton.addEventListener("click", ask);
    window.addEventListener("keydown", function (e) {
      var find = (e.ctrlKey || e.metaKey) && e.key === "f";
      if (find || e.key === "F3") { e.preventDefault(); ask(); }
      if (e.key === "Escape") { search(""); zoom(frames[0]); }
    });
    window.addEventListener("hashchange", fromUrl);
    fromUrl();
  }

  window.addEventListener("load", init);
})();
