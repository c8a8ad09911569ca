// The console's script (the CSP allows our own files, nothing inline): the header menu that folds behind
// a button on narrow screens, copy buttons, questions before destructive forms, and what a reader holds
// in a live fragment (focus, a text selection) kept through its refresh. keep-open.js keeps <details>
// open and log boxes scrolled.
(function () {
  "use strict";

  // A destructive form asks first: its data-confirm holds the question (an inline onsubmit is refused by
  // the CSP). Capturing on document runs before any handler of the form's own, htmx's included.
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopPropagation();
    }
  }, true);

  // Live fragments poll (hx-trigger "every Ns") and are swapped whole (outerHTML): the focused control is
  // destroyed with the old copy and focus falls to <body>, and a text selection in it is cleared. htmx itself
  // refocuses an element with an id; this finds the others again by what they are: their tag, name, href and
  // text, and which of the elements so described they were (with a looser match by tag, name and href when
  // the text changed, as a link's count or a scrolling table's rows do).
  function describe(el, loose) {
    return [el.getAttribute("name"), el.getAttribute("href"), loose ? "" : el.textContent.trim()].join("|");
  }

  function alike(scope, tag, key, loose) {
    return Array.prototype.filter.call(scope.getElementsByTagName(tag), function (el) {
      return describe(el, loose) === key;
    });
  }

  function remember(el, scope) {
    var what = { scope: scope, scopeId: scope.id, id: el.id, tag: el.tagName };
    if (el.id) return what;
    what.exact = describe(el, false);
    what.index = alike(scope, what.tag, what.exact, false).indexOf(el);
    // A control told apart by its text alone is not matched loosely: Enter on the wrong button could act.
    if (el.getAttribute("name") || el.getAttribute("href") || !/^(A|BUTTON|INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) {
      what.loose = describe(el, true);
      what.looseIndex = alike(scope, what.tag, what.loose, true).indexOf(el);
    }
    return what;
  }

  function findAgain(what) {
    if (what.id) return document.getElementById(what.id);
    // outerHTML: the new copy bears the old one's id; innerHTML: the target itself stayed.
    var scope = what.scope.isConnected ? what.scope : (what.scopeId && document.getElementById(what.scopeId));
    if (!scope) return null;
    return alike(scope, what.tag, what.exact, false)[what.index] ||
      (what.loose !== undefined ? alike(scope, what.tag, what.loose, true)[what.looseIndex] : null);
  }

  function isPoll(detail) {
    var elt = (detail.requestConfig && detail.requestConfig.elt) || detail.elt;
    var trigger = (elt && elt.getAttribute && elt.getAttribute("hx-trigger")) || "";
    // A poll's request has no triggering event; a click, a change or a submit has one.
    return /(^|,)\s*every\s/.test(trigger) && !(detail.requestConfig && detail.requestConfig.triggeringEvent);
  }

  function selectionIn(target) {
    var selection = window.getSelection();
    if (!selection || selection.isCollapsed || !selection.toString().trim()) return false;
    for (var i = 0; i < selection.rangeCount; i++) {
      if (selection.getRangeAt(i).intersectsNode(target)) return true;
    }
    return false;
  }

  var focused = null; // what was focused inside the fragment being swapped

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (!target || !event.detail.shouldSwap) return;
    // A reader selecting text in a polled fragment is reading it: this poll's copy is dropped, and the next
    // poll tries again (the polling goes on: the old element stays in the page).
    if (isPoll(event.detail) && selectionIn(target)) {
      event.detail.shouldSwap = false;
      return;
    }
    var active = document.activeElement;
    focused = active && active !== document.body && target.contains(active) ? remember(active, target) : null;
  });

  // On settle, not swap: the table a reader had focused is focusable again only once markScrollingTables ran.
  document.addEventListener("htmx:afterSettle", function () {
    var what = focused;
    focused = null;
    var active = document.activeElement;
    if (!what || (active && active !== document.body)) return;
    var again = findAgain(what);
    if (again && again.focus) again.focus({ preventScroll: true });
  });

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
