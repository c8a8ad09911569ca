// The console's only script of its own (the CSP allows our own files, nothing inline):
// the header menu that folds behind a button on narrow screens, and copy buttons.
(function () {
  "use strict";

  function setUpMenu() {
    var toggle = document.querySelector(".menu-toggle");
    var header = document.querySelector("header.top");
    if (!toggle || !header) return;
    toggle.hidden = false;
    header.classList.add("foldable"); // without this script the menu simply stays open
    toggle.addEventListener("click", function () {
      var open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(open));
      header.classList.toggle("menu-open", open);
    });
  }

  function setUpCopyButtons() {
    document.querySelectorAll("[data-copy-from]").forEach(function (button) {
      var source = document.getElementById(button.getAttribute("data-copy-from"));
      if (!source || !navigator.clipboard) return;
      button.hidden = false;
      var status = document.getElementById(button.getAttribute("data-copy-status"));
      function say(text) { if (status) status.textContent = text; }
      button.addEventListener("click", function () {
        navigator.clipboard.writeText(source.textContent.trim()).then(
          function () { say("Copied to the clipboard."); },
          function () { say("Could not copy: select the text and copy it."); }
        );
      });
    });
  }

  // A table (or a chart, on a phone) wider than its box scrolls in it; keyboard users reach that box with Tab.
  function markScrollingTables() {
    document.querySelectorAll("table.table, .chart-scroll").forEach(function (table) {
      if (table.scrollWidth > table.clientWidth + 1) table.setAttribute("tabindex", "0");
      else table.removeAttribute("tabindex");
    });
  }

  // A time chart too wide for a phone opens at its right end: the latest minutes, not the oldest.
  function showLatest() {
    document.querySelectorAll(".chart-scroll.at-end").forEach(function (box) { box.scrollLeft = box.scrollWidth; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setUpMenu();
    setUpCopyButtons();
    markScrollingTables();
    showLatest();
    window.addEventListener("resize", markScrollingTables);
    document.body.addEventListener("htmx:afterSettle", markScrollingTables);
    document.body.addEventListener("htmx:afterSettle", showLatest);
  });
})();
